"""hf-rstitch: R-Stitch stitched decoding as a transformers generation plugin.

    import hf_rstitch  # registers stitched decoding on GenerationMixin.generate
    out = llm.generate(**inputs, assistant_model=slm, stitch_threshold=0.02, return_dict_in_generate=True)
    out.stitch  # which model wrote each token, entropies, switches, per-call costs

Without the patch: ``llm.generate(..., custom_generate=hf_rstitch.stitched_decode,
stitch_slm=slm, stitch_threshold=0.02)``. ``hf_rstitch.unpatch()`` restores ``generate``.

Settings that travel with the LLM (``save_pretrained`` / ``push_to_hub``):
``hf_rstitch.configure(llm, threshold=0.005, slm="org/slm")``. Shipped files (the toy pair, its
router): ``hf_rstitch.shipped("llm")``, ``"slm"``, ``"router"``.
"""

from .core.policies import EntropyPolicy, RandomPolicy, ReplayPolicy, RoutingPolicy, StepView
from .core.roles import Role
from .core.trace import CallKind, ForwardCall, StitchTrace
from .hf.decode import stitched_decode
from .hf.output import StitchedGenerateOutput
from .hf.patch import is_patched, patch, unpatch
from .hf.persist import hook as _keep_settings_on_save
from .hf.settings import configure
from .resources import shipped

__version__ = "0.1.0"

__all__ = [
    "CallKind", "EntropyPolicy", "ForwardCall", "RandomPolicy", "ReplayPolicy", "Role", "RoutingPolicy",
    "StepView", "StitchTrace", "StitchedGenerateOutput", "configure", "is_patched", "patch", "shipped",
    "stitched_decode", "unpatch",
]

patch()
_keep_settings_on_save()
