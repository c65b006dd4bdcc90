"""A `mutate` tool: writes args.text to args.path (args arrive as JSON on
stdin). It keeps the idempotency key and its answer next to the file, so a
retry with the same key is recognised rather than applied twice, and gets
the answer the first call got (as payment APIs answer a repeated key)."""
import json
import os
import sys

args = json.load(sys.stdin)
key = os.environ["DURUN_IDEMPOTENCY_KEY"]
marker = args["path"] + ".key"
try:
    with open(marker) as f:
        done = json.load(f)
except (OSError, ValueError):
    done = {}
if done.get("key") == key:
    print(json.dumps(done["answer"]))
    sys.exit(0)
with open(args["path"], "w") as f:
    f.write(args["text"])
answer = {"path": args["path"], "bytes": len(args["text"].encode())}
with open(marker, "w") as f:
    json.dump({"key": key, "answer": answer}, f)
print(json.dumps(answer))
