"""A real S3-compatible server on the loopback for the object-store tests: moto's standalone server
(``python -m moto.server``) in a process of its own, and the sample sets uploaded into it.

A process of its own, not moto's in-process thread: DALI's readers open their S3 objects while a
pipeline is built, holding Python's lock, and a server thread in the same process could then
never answer them.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.object_store import moto_server  # the benchmark's loopback server, one definition

#: What the tests put in the AWS variables: never real credentials. The secret is what the
#: "never logged" test looks for in every output.
ACCESS_KEY = "crossdali-test-key"
SECRET_KEY = "crossdali-test-secret-3f9a1c"
REGION = "us-east-1"


def aws_env(endpoint: str) -> dict[str, str]:
    """The AWS variables that point a client (boto3, DALI's AWS SDK) at ``endpoint``."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"}


def upload_folder(endpoint: str, folder: Path, bucket: str, prefix: str, *, only=None) -> str:
    """Every file under ``folder`` (whose relative path ``only`` accepts, when given) as
    ``s3://bucket/prefix/<relative path>`` (the bucket is created if missing); returns that URL."""
    import boto3

    env = aws_env(endpoint)
    client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and (only is None or only(path.relative_to(folder).as_posix())):
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")
    return f"s3://{bucket}/{prefix}"


@contextmanager
def aws_environment(endpoint: str) -> Iterator[dict[str, str]]:
    """``aws_env(endpoint)`` set in ``os.environ`` for the block (restored after)."""
    env = aws_env(endpoint)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_shared: dict[str, object] = {}


def shared_server() -> str:
    """One moto server for the whole test process (stopped at exit): DALI's AWS SDK keeps the endpoint
    it first saw for the life of the process, so a second server on another port would never be
    asked."""
    if "endpoint" not in _shared:
        server = moto_server()
        _shared["endpoint"] = server.__enter__()
        atexit.register(server.__exit__, None, None, None)
    return str(_shared["endpoint"])


@contextmanager
def tiny_set_in_store(tiny_classification: Path) -> Iterator[tuple[str, str, Path]]:
    """(endpoint, ``s3://`` URL, local folder) of the tiny classification set in the shared moto
    server, with the AWS variables set for the block: the val split of every layout and the
    TFRecord train split (a few objects: CI's time), uploaded once per process."""
    endpoint = shared_server()
    with aws_environment(endpoint):
        if "tiny" not in _shared:
            _shared["tiny"] = upload_folder(endpoint, tiny_classification, "crossdali-tests", "tiny/classification",
                                            only=lambda rel: "val" in rel or rel.startswith("tfrecord/train"))
        yield endpoint, str(_shared["tiny"]), tiny_classification
