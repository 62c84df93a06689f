import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@pytest.fixture(autouse=True)
def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    yield
