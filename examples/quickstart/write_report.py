"""A `mutate` tool: writes args.text to args.path (args arrive as JSON on
stdin). It keeps the idempotency key next to the file, so a retry with the
same key is recognised rather than applied twice."""
import json
import os
import sys

args = json.load(sys.stdin)
key = os.environ["DURUN_IDEMPOTENCY_KEY"]
marker = args["path"] + ".key"
replay = os.path.exists(marker) and open(marker).read() == key
if not replay:
    with open(args["path"], "w") as f:
        f.write(args["text"])
    with open(marker, "w") as f:
        f.write(key)
print(json.dumps({"path": args["path"], "bytes": len(args["text"].encode()), "replayed": replay}))
