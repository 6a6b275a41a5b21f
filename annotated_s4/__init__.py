"""The Annotated S4: structured state space models, from the SSM to S4, H3, ETSC and Mamba.

Modules follow the book's reading order; later ones import only earlier ones.
Importing the package imports every layer module, and with it each layer's
registration in `annotated_s4.catalog` (what ``--layer`` names).
Beside them, `precision` (imported by nothing else in the package) says how
float32 matrices are multiplied on the device in use, and emulates a GPU's
TensorFloat-32 products on a CPU: with the environment variable
`ANNOTATED_S4_EMULATE_TF32=1`, importing this package switches the emulation on
for the whole process (see `annotated_s4.precision`).
"""

import os as _os

# XLA's CPU runtime (jaxlib 0.10) can deadlock when its concurrency-optimised
# scheduler runs two LAPACK custom calls (e.g. the batched matrix inverses of
# two SSM layers' discretizations) at the same time: the program never
# finishes. The flag is read when the CPU backend starts, so it must be set
# before the first computation; importing this package first is enough.
if "xla_cpu_enable_concurrency_optimized_scheduler" not in _os.environ.get("XLA_FLAGS", ""):
    _os.environ["XLA_FLAGS"] = (
        _os.environ.get("XLA_FLAGS", "")
        + " --xla_cpu_enable_concurrency_optimized_scheduler=false"
    ).strip()

from .precision import *  # noqa: F401,F403,E402
from .precision import _emulate_from_environment  # noqa: E402
from .ssm import *  # noqa: F401,F403,E402
from .hippo import *  # noqa: F401,F403,E402
from .s4 import *  # noqa: F401,F403,E402
from .probe import *  # noqa: F401,F403,E402
from .layers import *  # noqa: F401,F403,E402
from .models import *  # noqa: F401,F403,E402
from .h3 import *  # noqa: F401,F403,E402
from .attention import *  # noqa: F401,F403,E402
from .gru import *  # noqa: F401,F403,E402
from .toeplitz import *  # noqa: F401,F403,E402
from .selective import *  # noqa: F401,F403,E402
from .ssd import *  # noqa: F401,F403,E402
from .decoders import *  # noqa: F401,F403,E402
from .longconv import *  # noqa: F401,F403,E402
from .mamba import *  # noqa: F401,F403,E402
from .mamba2 import *  # noqa: F401,F403,E402

__version__ = "0.1.0"

_emulate_from_environment()
