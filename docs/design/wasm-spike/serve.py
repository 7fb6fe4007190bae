"""Static server for web/ on 127.0.0.1. --isolate adds COOP/COEP (not needed by sahpool)."""
import functools, http.server, sys

class Handler(http.server.SimpleHTTPRequestHandler):
    isolate = False
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".js": "text/javascript"}
    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        if self.isolate:
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()
    def log_message(self, *args):
        pass

port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
Handler.isolate = "--isolate" in sys.argv
handler = functools.partial(Handler, directory=sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else "web")
http.server.ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()
