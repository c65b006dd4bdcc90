"""A probe command for the probes tests: GETs $API_URL/resources/KEY
(argv[1]); prints the resource and exits 0, exits 1 on a 404 (it was never
made), 2 on anything else."""
import os
import sys
import urllib.error
import urllib.request

try:
    with urllib.request.urlopen(os.environ["API_URL"] + "resources/" + sys.argv[1], timeout=30) as reply:
        sys.stdout.write(reply.read().decode())
except urllib.error.HTTPError as exc:
    sys.exit(1 if exc.code == 404 else 2)
