"""A TCP forwarder in front of a server, which a test cuts to take the server away from its clients (they
get connection refused, open connections are reset) and restores on the same port: "the control plane is
down" for one gateway, without stopping the live server the test itself still talks to.

In front of several servers it is a load balancer's failover: each connection goes to the first server
that accepts it, and a test takes one out of rotation (``leave``) as a Service does when a pod's
preStop hook runs, so the connections it already carries finish there."""

import contextlib
import socket
import threading

from tests.support.processes import free_port


class Forwarder:
    def __init__(self, *target_ports: int):
        self.target_ports = list(target_ports)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def cut(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        with self.lock:
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self.open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            upstream = self._connect()
            if upstream is None:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:
                self.open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        for port in list(self.target_ports):
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                continue
        return None

    def leave(self, port: int) -> None:
        """New connections stop going to this server; those it carries continue."""
        self.target_ports.remove(port)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
