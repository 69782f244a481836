"""``python -m services.executor --mode sim|local --node-spec JSON_OR_@FILE [...]``"""

from libs.bus import run_service
from services.executor.service import NAME, arg_parser, main, validate

if __name__ == "__main__":
    run_service(NAME, main, parser=arg_parser(), validate=validate)
