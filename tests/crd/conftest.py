from tests.kube.fixtures import kube  # noqa: F401
