from stepscope.testing.kube.fixtures import kube  # noqa: F401 (the kube fixture)
