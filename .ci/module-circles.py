#!/usr/bin/env python3
"""Fails when two modules of src/ import each other, directly or round a circle.

Every `crate::a::b` and `super::x` path in a file (tests left out) is an
edge between the two sibling modules it crosses: `supervisor::commit`
naming `crate::supervisor::state::State` is commit -> state, and
`journal::sqlite` naming `crate::settings` is journal -> settings. A circle
at any level means a module cannot be understood without the other.
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    return parts[:-1] if parts[-1] == "mod" else parts


def paths_in(module, text):
    text = text.split("#[cfg(test)]\nmod tests", 1)[0]
    for path in re.findall(r"\bcrate::((?:\w+::)*\w+)", text):
        yield path.split("::")
    parent = module[:-1]
    for path in re.findall(r"\bsuper::((?:\w+::)*\w+)", text):
        yield parent + path.split("::")
    for group in re.findall(r"\bsuper::\{([^}]*)\}", text):
        for name in re.findall(r"(?:^|,)\s*(\w+)", group):
            yield parent + [name]


edges = {}
for directory, _, names in os.walk(ROOT):
    for name in names:
        if not name.endswith(".rs"):
            continue
        path = os.path.join(directory, name)
        module = module_of(path)
        if module in (["lib"], ["main"]):
            continue
        for target in paths_in(module, open(path, encoding="utf-8").read()):
            shared = 0
            while shared < min(len(module), len(target)) and module[shared] == target[shared]:
                shared += 1
            if shared < len(module) and shared < len(target):
                a = "::".join(module[: shared + 1])
                b = "::".join(target[: shared + 1])
                edges.setdefault(a, set()).add(b)

# Tarjan's strongly connected components.
index, low, stack, on_stack, circles = {}, {}, [], set(), []


def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for other in sorted(edges.get(node, ())):
        if other not in index:
            visit(other)
            low[node] = min(low[node], low[other])
        elif other in on_stack:
            low[node] = min(low[node], index[other])
    if low[node] == index[node]:
        component = []
        while True:
            other = stack.pop()
            on_stack.discard(other)
            component.append(other)
            if other == node:
                break
        if len(component) > 1:
            circles.append(sorted(component))


sys.setrecursionlimit(10000)
for node in sorted(set(edges) | {b for targets in edges.values() for b in targets}):
    if node not in index:
        visit(node)

if circles:
    for circle in circles:
        inside = set(circle)
        print("modules that import each other:", ", ".join(circle), file=sys.stderr)
        for a in circle:
            print(f"  {a} -> {', '.join(sorted(edges.get(a, set()) & inside))}", file=sys.stderr)
    sys.exit(1)
print(f"{len(edges)} modules, no import circle")
