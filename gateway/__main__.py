"""python -m gateway [--host 127.0.0.1] [--port 8080] [--workers 1] [--entry]"""

import argparse
import logging
import os

import uvicorn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--entry",
        action="store_true",
        help="run the global entry in front of regional gateways (GATEWAY_ENTRY_REGIONS), not a gateway",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gateway %(levelname)s %(message)s")
    uvicorn.run(
        "gateway.entry:app" if args.entry else "gateway.app:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="httptools",
        access_log=False,  # usage records are the request log; a line per request costs throughput
        lifespan="on",
        log_level="warning",
        # On SIGTERM: no new connections, requests in flight (streams included) finish for up to this long,
        # then what is still open is cut. Keep it below the orchestrator's grace (Kubernetes: 30 s).
        timeout_graceful_shutdown=int(os.environ.get("GATEWAY_SHUTDOWN_GRACE_SECONDS", "25")),
    )


if __name__ == "__main__":
    main()
