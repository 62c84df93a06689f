import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one thread per worker: the suite runs one worker per core (-n auto), and the tiny models gain nothing
    # from intra-op threads that would only compete with the other workers
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    yield
