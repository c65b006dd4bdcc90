"""An OTLP/HTTP trace receiver for the tests: each POST to /v1/traces is
decoded with the OpenTelemetry protocol's own classes (the
`opentelemetry-proto` package; OTLP's JSON writes trace and span ids in
hex, which become bytes as a collector reads them) and each span is
appended to SPANS_FILE as a JSON line with its ids in hex. A body that is
not a valid ExportTraceServiceRequest is answered 400 and noted there.

    otlp_receiver.py PORT_FILE SPANS_FILE"""

import base64
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

port_file, spans_file = sys.argv[1], sys.argv[2]


def ids_to_base64(value):
    if isinstance(value, dict):
        return {key: (base64.b64encode(bytes.fromhex(item)).decode()
                      if key in ("traceId", "spanId", "parentSpanId") and isinstance(item, str)
                      else ids_to_base64(item))
                for key, item in value.items()}
    if isinstance(value, list):
        return [ids_to_base64(item) for item in value]
    return value


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            request = json_format.Parse(json.dumps(ids_to_base64(json.loads(body))),
                                        trace_service_pb2.ExportTraceServiceRequest())
            lines = []
            for resource in request.resource_spans:
                service = {a.key: a.value.string_value for a in resource.resource.attributes}.get("service.name")
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        attributes = {}
                        for a in span.attributes:
                            kind = a.value.WhichOneof("value")
                            attributes[a.key] = getattr(a.value, kind)
                        lines.append({
                            "service": service, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(), "name": span.name,
                            "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                            "status": span.status.code, "attributes": attributes})
            status = 200
        except Exception as err:  # noted for the test to see
            lines = [{"error": str(err)}]
            status = 400
        with open(spans_file, "a") as out:
            for line in lines:
                out.write(json.dumps(line) + "\n")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # An exporter that closed its connection (durun ended) is expected.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


server = Server(("127.0.0.1", 0), Handler)
with open(port_file + ".tmp", "w") as out:
    out.write(str(server.server_port))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
