"""eagle3-regen: regenerate EAGLE-3 drafter training data with the target model's own token ids.

For trainers: `regen.read_training_data(manifest_uri)` yields a published version's records as pyarrow batches, each
file checked against its manifest before it is read; `regen verify` checks a whole version.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

# The pipeline loads tokenizers only, never a model: transformers' advice that PyTorch is missing ("Models won't be
# available") would be noise in every task's log. Set before transformers is imported; a caller's own value wins.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def read_training_data(
    manifest_uri: str, s3_client: Any = None, split: str = "train", columns: list[str] | None = None
) -> Iterator[Any]:
    """See regen.verify.read_training_data (imported on use: `import regen` stays light)."""
    from regen.verify import read_training_data as read

    return read(manifest_uri, s3_client, split, columns)
