"""File formats and measurements around the policy, kept out of ``libs.policy`` (which reads no
files): cluster files (``cluster_file``) and the derivation of ``libs/policy/data/profiles.json``
from the public traces (``derive_profiles``)."""
