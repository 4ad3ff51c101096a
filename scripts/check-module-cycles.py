#!/usr/bin/env python3
"""Fails when the modules of a workspace crate import each other in a circle.

Every `use crate::…`, `use super::…` and inline `crate::…`/`super::…` path is an edge
between two sibling modules: the children of the two files' closest common ancestor on
each side. (A module using its parent or its own children is not an edge: `mod`
declarations and re-exports go that way by design.) Each level's siblings must form a
graph without cycles, so that a module can be read knowing only those below it.

Usage: scripts/check-module-cycles.py [CRATE_SRC_DIR...]   (default: every crate here)
"""

import pathlib
import re
import sys
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parent.parent

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
INLINE_PATH = re.compile(rf"(?<![\w:$])(crate|super|self)((?:::{IDENT})+)")
USE = re.compile(r"\buse\s+((?:crate|super|self)\b[^;]*);", re.S)
# `pub use backend::InboxBackend;` in lib.rs names a child without `crate::`.
REEXPORT = re.compile(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]*);", re.S)


def strip_comments_and_tests(source):
    # Line comments (doc comments and intra-doc links included) and block comments.
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    source = re.sub(r"//[^\n]*", "", source)
    # A file's unit tests sit in `#[cfg(test)] mod tests { … }` at its end (or under
    # `cfg(all(test, …))`); their `super::*` names the file's own module, and test code
    # is not part of the layering.
    cut = re.search(
        r"#\[cfg\((?:test|all\(test\b[^\]]*)\)\]\s*(pub\s+)?mod\s+\w+\s*\{", source
    )
    return source[: cut.start()] if cut else source


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [re.sub(r"\bas\w+$", "", tree)] if tree else []
    prefix, body = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    paths, depth, start = [], 0, 0
    for index, char in enumerate(body + ","):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            part = body[start:index]
            start = index + 1
            for sub in expand_use_tree(part):
                paths.append(prefix + sub if sub not in ("self", "") else prefix.rstrip(":"))
    return paths


def module_of(file, src):
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
        parts = parts[:-1]
    return tuple(parts)


def resolve(path, module, is_dir_module):
    """An absolute module path for `crate::…`, `super::…` or `self::…`, as a tuple."""
    segments = path.split("::")
    head, rest = segments[0], segments[1:]
    if head == "crate":
        base = ()
    else:
        # In a.rs or a/mod.rs, `self` is `a`; `super` is its parent.
        base = module
        while head in ("super", "self"):
            if head == "super":
                base = base[:-1]
            if not rest:
                break
            head, rest = rest[0], rest[1:]
        else:
            rest = [head] + rest
        if head in ("super", "self"):
            rest = []
    return base + tuple(s for s in rest if s and s != "*")


def crate_dirs():
    for manifest in sorted(ROOT.glob("**/Cargo.toml")):
        if "target" in manifest.parts or ".git" in manifest.parts:
            continue
        src = manifest.parent / "src"
        if src.is_dir():
            yield src


def reexports_in(files, src):
    """module -> {name: absolute path} for its `pub use`s, so that a path through a
    re-export (`crate::InvalidKey`) counts as a use of the module that defines it."""
    found = defaultdict(dict)
    for file in files:
        module = module_of(file, src)
        for tree in REEXPORT.findall(strip_comments_and_tests(file.read_text())):
            for path in expand_use_tree(tree):
                if not path.split("::")[0] in ("crate", "super", "self"):
                    path = "self::" + path
                target = resolve(path, module, True)
                if target:
                    found[module][target[-1]] = target
    return found


def through_reexports(target, reexports):
    for _ in range(8):  # a chain of re-exports is short
        for depth in range(len(target)):
            name = target[depth]
            via = reexports.get(target[:depth], {}).get(name)
            if via and via != target[: depth + 1]:
                target = via + target[depth + 1 :]
                break
        else:
            return target
    return target


def cycles_in(src):
    files = sorted(src.rglob("*.rs"))
    modules = {module_of(f, src) for f in files}
    reexports = reexports_in(files, src)
    # parent -> child -> set of (sibling, file that imports it)
    edges = defaultdict(lambda: defaultdict(set))
    for file in files:
        module = module_of(file, src)
        is_dir_module = file.name in ("mod.rs", "lib.rs", "main.rs")
        text = strip_comments_and_tests(file.read_text())
        paths = [p for tree in USE.findall(text) for p in expand_use_tree(tree)]
        paths += [m.group(1) + m.group(2) for m in INLINE_PATH.finditer(text)]
        for path in paths:
            target = through_reexports(resolve(path, module, is_dir_module), reexports)
            while target and target not in modules:
                target = target[:-1]
            common = 0
            while common < min(len(module), len(target)) and module[common] == target[common]:
                common += 1
            if common == len(module) or common == len(target):
                continue  # an ancestor or a descendant
            parent = module[:common]
            edges[parent][module[common]].add((target[common], file.relative_to(ROOT)))
    found = []
    for parent, graph in edges.items():
        for component in strongly_connected(graph):
            if len(component) > 1:
                found.append((parent, component, graph))
    return found


def strongly_connected(graph):
    index, low, stack, on_stack, result = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for successor, _ in graph.get(node, ()):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            result.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return result


def main():
    dirs = [pathlib.Path(d).resolve() for d in sys.argv[1:]] or list(crate_dirs())
    failed = False
    for src in dirs:
        for parent, component, graph in cycles_in(src):
            failed = True
            where = "::".join(parent) or "crate root"
            print(f"{src.relative_to(ROOT)}: modules under {where} import each other in a circle:")
            for node in component:
                for successor, file in sorted(graph[node]):
                    if successor in component:
                        print(f"    {node} -> {successor}   ({file})")
    if failed:
        sys.exit(1)
    print(f"no import cycles in {len(dirs)} crates")


if __name__ == "__main__":
    main()
