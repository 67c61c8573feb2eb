"""Fetch a package's source distribution from pip's index, verified by sha256.

`pip download --no-binary` cannot fetch vLLM's sdist (it prepares metadata, and
the CPU-target metadata names a direct-URL dependency), so read the file's
address from the index's JSON simple API instead. The index is pip's own
configured one, never a hard-coded host.
"""
import hashlib
import json
import os
import ssl
import subprocess
import sys
import urllib.request


def index_url() -> str:
    out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                         capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip().rstrip("/")
    from pip._internal.models.index import PyPI
    return PyPI.simple_url.rstrip("/")


def fetch(name: str, version: str, dest: str) -> str:
    fname = f"{name}-{version}.tar.gz"
    path = os.path.join(dest, fname)
    if os.path.exists(path):
        return path
    ctx = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
    req = urllib.request.Request(f"{index_url()}/{name}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, context=ctx, timeout=120) as r:
        files = json.load(r)["files"]
    match = [f for f in files if f["filename"] == fname]
    if not match:
        sys.exit(f"fetch_sdist: {fname} not on the index (files: {len(files)})")
    entry = match[0]
    os.makedirs(dest, exist_ok=True)
    tmp = path + ".part"
    with urllib.request.urlopen(entry["url"], context=ctx, timeout=600) as r, open(tmp, "wb") as f:
        while chunk := r.read(1 << 20):
            f.write(chunk)
    want = entry["hashes"].get("sha256")
    got = hashlib.sha256(open(tmp, "rb").read()).hexdigest()
    if want and want != got:
        os.unlink(tmp)
        sys.exit(f"fetch_sdist: sha256 mismatch for {fname}: {got} != {want}")
    os.replace(tmp, path)
    return path


if __name__ == "__main__":
    print(fetch(sys.argv[1], sys.argv[2], sys.argv[3]))
