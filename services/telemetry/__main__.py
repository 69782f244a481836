"""``python -m services.telemetry --backend sim|nvml [--node-spec JSON_OR_@FILE ...]``"""

from libs.bus import run_service
from services.telemetry.service import NAME, arg_parser, main, validate

if __name__ == "__main__":
    run_service(NAME, main, parser=arg_parser(), validate=validate)
