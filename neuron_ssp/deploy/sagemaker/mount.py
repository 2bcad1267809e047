"""Where the models live inside a SageMaker container, and where they must sit in S3 for that.

SageMaker copies the S3 prefix given as `ModelDataSource.S3DataSource` (S3Prefix, uncompressed) to
`/opt/ml/model`. Each model of the config goes in a folder named like the last part of its path, as
in the EC2 deploy's `--weights-s3-uri`, and compiled artifacts go in `compiled/`.
"""

from __future__ import annotations

import posixpath

MODEL_MOUNT = "/opt/ml/model"
COMPILED_FOLDER = "compiled"


def folder_name(path: str) -> str:
    """/opt/models/Llama-2-70b-hf -> Llama-2-70b-hf (also for s3:// URIs and trailing slashes)."""
    return posixpath.basename(path.rstrip("/")) or path


def mounted(path: str, root: str = MODEL_MOUNT) -> str:
    return posixpath.join(root, folder_name(path))


def s3_folder(model_s3: str, path: str) -> str:
    return model_s3.rstrip("/") + "/" + folder_name(path) + "/"
