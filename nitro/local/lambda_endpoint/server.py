"""The endpoint process: serve the API until SIGTERM/SIGINT (or the parent's lifeline closes)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from .api import LambdaApi
from .config import FunctionConfig
from .httpd import start_server

log = logging.getLogger("nitro.local.lambda_endpoint")


async def serve(functions: list[FunctionConfig], host: str, port: int, *, ready_fd: int | None = None,
                lifeline_fd: int | None = None, print_url: bool = True) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if lifeline_fd is not None:
        # The parent holds the write end; end of file means it has gone, so must we.
        def parent_gone() -> None:
            loop.remove_reader(lifeline_fd)  # level-triggered: would fire on every loop pass
            stop.set()

        loop.add_reader(lifeline_fd, parent_gone)

    api = LambdaApi(functions)
    server = await start_server(api, host, port)
    bound_port = server.sockets[0].getsockname()[1]
    url = f"http://{host}:{bound_port}"
    if print_url:
        print(url, flush=True)
    if ready_fd is not None:
        os.write(ready_fd, (url + "\n").encode())
        os.close(ready_fd)
    log.info("local lambda listening on %s: %s", url, ", ".join(f.name for f in functions))

    await stop.wait()
    server.close()  # stop accepting; in-flight requests end with their workers below
    await api.close()


def run(functions: list[FunctionConfig], host: str = "127.0.0.1", port: int = 0, **kwargs) -> None:
    asyncio.run(serve(functions, host, port, **kwargs))
