"""``mosaic sim --set KEY=VALUE``: the simulator's name for ``libs.policy_io.overrides``.

Why a re-export: the override rules moved to ``libs.policy_io`` so the live services can load a
policy file (``--policy-file``) by the same rules without importing the simulator; this module
keeps the simulator's import path.
"""

from libs.policy_io.overrides import FALSE, TRUE, apply_overrides, apply_values, parse_value

__all__ = ["FALSE", "TRUE", "apply_overrides", "apply_values", "parse_value"]
