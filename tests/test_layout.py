"""The layers keep their rules (docs/design.md), checked on the real imports of every module:
AST, every level (lazy imports inside functions included), relative imports resolved."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def cselab_imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any level (lazy imports in functions included),
    resolved to absolute ``cselab.…`` names, with each imported name as a submodule candidate."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    src = SRC
    package = ".".join(path.relative_to(src).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


#: The objectives' public entry points the training machinery may use; everything else of
#: ``cselab.objectives`` (a paper's part, a config sub-section) is a specific objective.
GENERIC = {
    "cselab.objectives",
    "cselab.objectives.Objective",
    "cselab.objectives.ObjectiveContext",
    "cselab.objectives.PrepareContext",  # what an objective's prepare hook may know
    "cselab.objectives.LossTerms",
    "cselab.objectives.build_objective",
    "cselab.objectives.total_loss",
    "cselab.objectives.VIEW_ANCHOR",  # the view names are the interface between the two
    "cselab.objectives.VIEW_POSITIVE",
    "cselab.objectives.VIEW_OFF_DROPOUT",
    "cselab.objectives.VIEW_HARD_NEGATIVE",
    "cselab.objectives.VIEW_MOMENTUM",
    "cselab.objectives.VIEW_TOKEN_LOGITS",  # token prediction (MNTP)
    "cselab.objectives.VIEW_TOKEN_LABELS",
}


def test_training_never_imports_a_specific_objective() -> None:
    """Checked on the real imports (AST, every level, relative ones resolved) of every module of
    the training machinery, not on the text of top-level lines."""
    folder = SRC / "cselab/training"
    for path in sorted(folder.glob("*.py")):
        specific = {
            name
            for name in cselab_imports(path)
            if name.startswith("cselab.objectives") and name not in GENERIC
        }
        assert not specific, (path.name, sorted(specific))


def test_import_check_sees_relative_and_lazy_imports(tmp_path: Path) -> None:
    """The check above fails on the imports the old line-based check let through."""
    src = SRC
    fake = src / "cselab/training/_probe_imports.py"
    fake.write_text(
        "from ..objectives import FocalScore\n"
        "def f():\n    from cselab.objectives.mixcse import MixedNegatives\n",
        encoding="utf-8",
    )
    try:
        names = cselab_imports(fake)
    finally:
        fake.unlink()
    assert {"cselab.objectives.FocalScore", "cselab.objectives.mixcse"} <= names
    assert not ({"cselab.objectives.FocalScore", "cselab.objectives.mixcse"} & GENERIC)


def internal_graph() -> dict[str, set[str]]:
    """``module -> cselab modules it imports`` (an imported name counts as its module)."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for imported in cselab_imports(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                found.add(imported)
        graph[name] = found
    return graph


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``edges`` (depth-first search), or ``None``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circles_in_src() -> None:
    # Importing a submodule imports its package first: a package's __init__ importing its own
    # submodules is not a circle, so edges from a package into itself are left out. The root
    # package is the exception: `cselab/__init__` is the public face and imports from every
    # layer, so its edges are kept (and nothing may import it: see the next test).
    edges = {
        m: {d for d in deps if m == "cselab" or not d.startswith(m + ".")}
        for m, deps in internal_graph().items()
    }
    cycle = find_cycle(edges)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_nothing_imports_the_root_package() -> None:
    """``cselab/__init__`` (``cselab.load``, ``cselab.train``) is for users; inside the package
    every name is imported from its home, so the root can never close a circle."""
    importers = sorted(m for m, deps in internal_graph().items() if "cselab" in deps)
    assert importers == [], importers


#: ``layer -> the layers it must never import``, bottom to top (docs/design.md). A layer may
#: import anything below it; these lists name everything above or beside it.
TOP = ("cselab.cli", "cselab.st", "cselab.__main__")
LAYER_RULES: dict[str, tuple[str, ...]] = {
    "cselab.core": ("cselab.",),  # but itself
    "cselab.io": ("cselab.",),  # but cselab.core and itself
    # an objective makes its token-level views from the step's inputs (its prepare hook), so it
    # may read the data layer's batch types and token draws; never the model
    "cselab.objectives": (
        "cselab.model",
        "cselab.config",
        "cselab.training",
        "cselab.evaluation",
        "cselab.search",
        "cselab.publish",
        "cselab.app",
        "cselab.insight",
        *TOP,
    ),
    "cselab.model": (
        "cselab.objectives",
        "cselab.data",
        "cselab.config",
        "cselab.training",
        "cselab.evaluation",
        "cselab.search",
        "cselab.publish",
        "cselab.app",
        "cselab.insight",
        *TOP,
    ),
    "cselab.data": (
        "cselab.model",
        "cselab.objectives",
        "cselab.config",
        "cselab.training",
        "cselab.evaluation",
        "cselab.search",
        "cselab.publish",
        "cselab.app",
        "cselab.insight",
        *TOP,
    ),
    "cselab.config": (
        "cselab.training",
        "cselab.evaluation",
        "cselab.search",
        "cselab.publish",
        "cselab.app",
        "cselab.insight",
        *TOP,
    ),
    "cselab.evaluation": (
        "cselab.training",
        "cselab.search",
        "cselab.publish",
        "cselab.app",
        "cselab.insight",
        *TOP,
    ),
    "cselab.search": ("cselab.training", "cselab.publish", "cselab.app", "cselab.insight", *TOP),
    # models out (the card, the Hub) sits above training: the trainer tells callbacks
    "cselab.training": ("cselab.search", "cselab.publish", "cselab.app", "cselab.insight", *TOP),
    "cselab.publish": ("cselab.search", "cselab.app", "cselab.insight", *TOP),
    # the composition root assembles a run from every layer below it; sweeps run it
    "cselab.app": ("cselab.search", "cselab.insight", *TOP),
    "cselab.insight": (*TOP,),
}
ALLOWED = {"cselab.core": ("cselab.core",), "cselab.io": ("cselab.core", "cselab.io")}


def layer_violations(graph: dict[str, set[str]]) -> list[tuple[str, list[str]]]:
    found = []
    for name, deps in sorted(graph.items()):
        for layer, forbidden in LAYER_RULES.items():
            if name == layer or name.startswith(layer + "."):
                ok = ALLOWED.get(layer, ())
                bad = sorted(
                    d
                    for d in deps
                    if d.startswith(forbidden) and not (d.startswith(ok) or d == layer)
                )
                if bad:
                    found.append((name, bad))
    return found


def test_lower_layers_never_import_upper_ones() -> None:
    bad = layer_violations(internal_graph())
    assert not bad, bad


def test_objectives_never_import_torch_distributed() -> None:
    for path in (SRC / "cselab/objectives").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {n for n in names if n.startswith("torch.distributed")}, path.name


def test_the_checks_can_fail() -> None:
    """A circle is found, and a probe module of the model layer importing the trainer breaks
    the layering rule."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    probe = SRC / "cselab/model/_probe_layer.py"
    probe.write_text("def f():\n    from ..training import trainer\n", encoding="utf-8")
    try:
        try:
            test_lower_layers_never_import_upper_ones()
        except AssertionError as err:
            assert "_probe_layer" in str(err) and "cselab.training.trainer" in str(err)
        else:
            raise AssertionError("a lazy import of the trainer in the model layer went unseen")
    finally:
        probe.unlink()


def _called(node: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    """``(name, call)`` of every call under ``node``: ``hashlib.sha256``, ``os.replace``, or
    ``.read`` for a method of any object."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            owner = n.func.value.id if isinstance(n.func.value, ast.Name) else ""
            yield f"{owner}.{n.func.attr}", n
            if owner:
                yield f".{n.func.attr}", n


def _receiver(call: ast.Call) -> str | None:
    """``tmp`` of ``tmp.write_text(...)``."""
    func = call.func
    return (
        func.value.id
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
        else None
    )


def helper_homes() -> dict[str, set[str]]:
    """The functions of ``src`` that hash a file's bytes with SHA-256, write JSON to a file
    and rename that file over its target (by ``os.replace`` or ``atomic_path``), or write the
    separator row of a markdown table."""
    homes: dict[str, set[str]] = {
        "file sha256": set(),
        "atomic json": set(),
        "markdown table": set(),
        "yaml parse": set(),
    }
    for path in sorted(SRC.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            name = f"{module_name(path)}.{fn.name}"
            calls = list(_called(fn))
            names = {n for n, _ in calls}
            if "hashlib.sha256" in names and ".read" in names:
                homes["file sha256"].add(name)
            json_written = {
                _receiver(c)
                for n, c in calls
                if n == ".write_text"
                and c.args
                and isinstance(c.args[0], ast.Call)
                and ast.unparse(c.args[0].func) == "json.dumps"
            }
            renamed = {
                c.args[0].id
                for n, c in calls
                if n == "os.replace" and isinstance(c.args[0], ast.Name)
            }
            # `with atomic_path(target) as tmp:` renames tmp over target when the block ends
            renamed |= {
                item.optional_vars.id
                for w in ast.walk(fn)
                if isinstance(w, ast.With)
                for item in w.items
                if isinstance(item.context_expr, ast.Call)
                and ast.unparse(item.context_expr.func).endswith("atomic_path")
                and isinstance(item.optional_vars, ast.Name)
            }
            if json_written & renamed:
                homes["atomic json"].add(name)
            if names & {"yaml.safe_load", "yaml.load", "yaml.full_load"}:
                homes["yaml parse"].add(name)
            if any(isinstance(c, ast.Constant) and "---|" in str(c.value) for c in ast.walk(fn)):
                homes["markdown table"].add(name)
    return homes


def test_one_home_per_helper() -> None:
    """The SHA-256 of a file, an atomic JSON write, a markdown table and the parsing of YAML
    (with its one-line error naming the file and line) are each written once, in the lowest
    layer that needs them, and imported wherever else they are used."""
    assert helper_homes() == {
        "file sha256": {"cselab.io.files.file_digest"},
        "atomic json": {"cselab.io.files.write_json_atomic"},
        "markdown table": {"cselab.evaluation.table.markdown_table"},
        # _parse_scalar reads one `--key=value` override's value, never a file
        "yaml parse": {"cselab.io.readers.parse_yaml", "cselab.config._parse_scalar"},
    }


def test_the_composition_root_sits_above_training_and_publish() -> None:
    """No module of training imports ``cselab.publish`` or the composition root ``cselab.app``
    (no exemption: training's old composition root importing the card's callbacks breaks the
    rule now), the root assembles the callbacks that write what leaves a run, and it never
    imports what sits above it (``cselab.insight``, which runs it)."""
    graph = {
        "cselab.training.trainer": {"cselab.publish.card"},
        "cselab.training.run": {"cselab.publish.callbacks"},
        "cselab.training.sweep": {"cselab.app.train"},
        "cselab.publish.card": {"cselab.app.plan"},
        "cselab.app.train": {"cselab.publish.callbacks", "cselab.insight.sweep"},
        "cselab.insight.sweep": {"cselab.app.train"},
    }
    assert layer_violations(graph) == [
        ("cselab.app.train", ["cselab.insight.sweep"]),
        ("cselab.publish.card", ["cselab.app.plan"]),
        ("cselab.training.run", ["cselab.publish.callbacks"]),
        ("cselab.training.sweep", ["cselab.app.train"]),
        ("cselab.training.trainer", ["cselab.publish.card"]),
    ]
    real = internal_graph()
    assert "cselab.publish.callbacks" in real["cselab.app.train"]
    assert "cselab.app.train" in real["cselab.insight.sweep"]
    assert "cselab.app.train" in real["cselab.cli.train"] and "cselab.app.train" in real["cselab"]
    assert not any(
        d.startswith(("cselab.publish", "cselab.app"))
        for m, deps in real.items()
        if m.startswith("cselab.training")
        for d in deps
    )


def test_the_table_of_backbones_is_the_one_home_of_architecture_names() -> None:
    """Per-architecture facts live in ``cselab.model.backbones``: no other module of the
    package spells a ``model_type`` of the table as a string constant (a second list of
    architectures), and the table sits in the model layer, which objectives never import
    (they see embeddings only: ``LAYER_RULES``)."""
    from cselab.model.backbones import BACKBONES

    home = SRC / "cselab/model/backbones.py"
    assert home.is_file()
    names = set(BACKBONES)
    found = []
    for path in sorted((SRC / "cselab").rglob("*.py")):
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append((path.name, node.value, node.lineno))
    assert found == []
    assert "cselab.model" in LAYER_RULES["cselab.objectives"]


#: the package faces that are lazy re-exports only (docs/design.md, "A package face costs
#: nothing"); the root adds its two one-line functions
LAZY_FACES = ("cselab", "cselab.data", "cselab.objectives", "cselab.evaluation", "cselab.search")
FACE_FUNCTIONS = {"cselab": {"load", "train"}}


def face_problems(path: Path, functions: set[str]) -> list[str]:
    """What in a package ``__init__`` is more than a docstring and lazy re-exports."""
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom) and (
            node.module == "__future__"
            or (node.level and node.module in ("core.lazy", "core.version"))
        ):
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign):
            continue  # _HOMES, __all__, __getattr__/__dir__
        if isinstance(node, ast.FunctionDef) and node.name in functions:
            continue
        found.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def test_package_faces_are_lazy_re_exports() -> None:
    for package in LAZY_FACES:
        path = SRC / package.replace(".", "/") / "__init__.py"
        assert face_problems(path, FACE_FUNCTIONS.get(package, set())) == [], package


def test_the_face_check_can_fail(tmp_path: Path) -> None:
    face = tmp_path / "__init__.py"
    face.write_text('"""A face."""\nfrom .store import TokenizedCorpus\n', encoding="utf-8")
    assert face_problems(face, set()) == ["line 2: from .store import TokenizedCorpus"]


def test_every_objective_build_is_registered() -> None:
    """Each paper module's ``build`` (``def build...(section, parts)``) is one entry of the
    ordered registry ``OBJECTIVE_PARTS``, and only the registry assembles objectives."""
    registry = (SRC / "cselab/objectives/registry.py").read_text(encoding="utf-8")
    tree = ast.parse(registry)
    (parts,) = [
        n.value
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "OBJECTIVE_PARTS"
    ]
    registered = {ast.unparse(entry.elts[1]) for entry in parts.elts}  # type: ignore[attr-defined]
    builds = {
        f"{path.stem}.{fn.name}"
        for path in (SRC / "cselab/objectives").glob("*.py")
        for fn in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(fn, ast.FunctionDef)
        and fn.name.startswith("build")
        and path.stem != "registry"
    }
    assert builds == registered
    users = {
        module_name(p)
        for p in SRC.rglob("*.py")
        if "cselab.objectives.assembly" in cselab_imports(p)
    }
    assert users <= {f"cselab.objectives.{b.split('.')[0]}" for b in builds} | {
        "cselab.objectives.registry",
        "cselab.objectives",
    }


def test_no_module_over_600_lines() -> None:
    """A module that outgrows one reading is split by what its parts do (``io/tables.py`` from
    ``io/readers.py``; ``search/layout.py``, ``ann.py``, ``build.py`` from ``search/index.py``),
    the old path re-exporting the moved names."""
    sizes = {
        module_name(p): len(p.read_text(encoding="utf-8").splitlines()) for p in SRC.rglob("*.py")
    }
    assert {m: n for m, n in sizes.items() if n > 600} == {}


def string_constants(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of every string constant of a module (f-strings' literal parts
    included), docstrings left out: they explain, the code is what runs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


#: STS-B dev's names: ``eval.dev``'s value and DevSet kind, its score's column in ``metrics.csv``
DEV_NAME_LITERALS = {"stsb", "stsb_dev", "stsb_dev_", "stsb_dev_pearson"}
#: Their one home (``STSB``, ``STSB_DEV``, ``dev_score_name``, ``DevKind``)
DEV_NAME_HOME = "cselab/core/metrics.py"


def dev_name_spellings(src: Path) -> list[str]:
    """``module:line literal`` for each spelling of STS-B dev's names outside their home."""
    return [
        f"{path.relative_to(src)}:{line} {text!r}"
        for path in sorted(src.rglob("*.py"))
        if path.relative_to(src).as_posix() != DEV_NAME_HOME
        for line, text in string_constants(path)
        if text in DEV_NAME_LITERALS
    ]


def test_dev_set_names_have_one_home() -> None:
    """``"stsb"`` and ``"stsb_dev"`` are spelled once, in ``core/metrics.py``; the config, the
    dev set, model selection, the card, the plots, the report and the CLI import them."""
    assert dev_name_spellings(SRC) == []


def test_the_dev_name_check_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "cselab"
    pkg.mkdir()
    (pkg / "plots.py").write_text(
        '"""Mentions ``stsb_dev`` in prose."""\n'
        'def f(name="stsb_dev"):\n    return f"stsb_dev_{name}" if name == "stsb" else name\n'
    )
    assert sorted(dev_name_spellings(tmp_path)) == [
        "cselab/plots.py:2 'stsb_dev'",
        "cselab/plots.py:3 'stsb'",
        "cselab/plots.py:3 'stsb_dev_'",
    ]


#: A command-line flag (``--overwrite``), not a config override (``--train.resume=true``, which
#: ``load_config(overrides)`` takes as it is) nor a rule of dashes.
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w.-])")
#: Library modules whose strings name flags on purpose: a sweep writes the command lines of its
#: cells; the model card and the sweep report tell their reader which command fills a section.
FLAGS_ON_PURPOSE = {
    "cselab/insight/sweep.py",
    "cselab/publish/card.py",
    "cselab/insight/report.py",
}


def flag_spellings(src: Path) -> dict[str, list[str]]:
    """Library module -> the command-line flags its strings name (the CLI's own modules left
    out)."""
    found: dict[str, list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        name = path.relative_to(src).as_posix()
        if name.startswith("cselab/cli/") or name in FLAGS_ON_PURPOSE:
            continue
        flags = [flag for _, text in string_constants(path) for flag in FLAG.findall(text)]
        if flags:
            found[name] = flags
    return found


def test_library_code_names_no_command_line_flag() -> None:
    """A library error names the setting or key (``overwrite=True``, ``pooler=NAME``); the CLI
    shows its flag (a ``SettingError``, spelled by ``cli/options.py``'s ``setting_words``)."""
    assert flag_spellings(SRC) == {}


def test_the_flag_check_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "cselab" / "search"
    pkg.mkdir(parents=True)
    (pkg / "index.py").write_text(
        '"""``--backend`` in prose."""\n'
        'MSG = "pass --overwrite, or --train.resume=true; a rule ---|"\n'
        'def f(n):\n    return f"pass a smaller --nlist than {n}"\n'
    )
    assert flag_spellings(tmp_path) == {"cselab/search/index.py": ["--overwrite", "--nlist"]}


#: what a step's inputs once said through key prefixes; now the fields of ``StepInputs``
BATCH_KEY_PREFIXES = ("positive.", "negative.", "masked.")


def batch_key_literals(source: str) -> list[str]:
    """String constants of ``source`` that start with a batch-key prefix (a store's column
    file names are f-strings, ``f"negative.{k}"``: their pieces are not keys of a batch, and
    docstrings are prose)."""
    tree = ast.parse(source)
    skip = {
        id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values
    }
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))  # a docstring
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and node.value.startswith(BATCH_KEY_PREFIXES)
    ]


def test_step_inputs_are_typed_not_prefixed_keys() -> None:
    """Issue 28 point 6: a step's columns are ``StepInputs`` fields (``cselab.data.inputs``),
    produced by both stores through ``step_inputs``; no module spells a batch-key prefix or
    sniffs one (``is_pair_batch``)."""
    found = {
        module_name(p): hits
        for p in SRC.rglob("*.py")
        if (hits := batch_key_literals(p.read_text(encoding="utf-8")))
        or "is_pair_batch" in p.read_text(encoding="utf-8")
    }
    assert found == {}
    assert batch_key_literals('KEY = "positive." + "input_ids"\n') == ["positive."]
    assert batch_key_literals('f"negative.{k}"\n') == []


#: The layers that run after ``cselab.app.plan.resolve``: they take a ``RunPlan`` for the
#: facts a run resolves, never the raw config. ``app/plan.py`` resolves them (from the config,
#: once) and ``publish/folder_plan.py`` finds a saved folder's (its run's plan, or the facts the
#: folder records), so those two read the config's keys.
AFTER_THE_PLAN = ("cselab/training/", "cselab/publish/", "cselab/app/")
WHERE_RESOLVED = ("cselab/app/plan.py", "cselab/publish/folder_plan.py")
#: The config keys a plan resolves (``objective``: the whole section, which the plan keeps
#: validated): reading one of these off a config after the plan exists is a second source.
RESOLVED_KEYS = (
    "model.pooler",
    "model.lora.target_modules",
    "train.precision",
    "train.device",
    "train.compile",  # both: the plan's compile_mode
    "train.compile_mode",
    "eval.dev",
    "eval.dev_metric",
    "eval.dev_columns",
    "eval.batch_size",  # the plan's eval_batch_size
    "objective",
)
#: what names the raw config in code: ``config``, ``cfg``, ``self.config``, ...
CONFIG_NAMES = ("config", "cfg")


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]`` (names and attributes only), else ``None``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _config_path(chain: list[str], aliases: dict[str, list[str]]) -> str | None:
    """The config key a chain reads (``train.precision`` of ``self.config.train.precision``, or
    of ``tc.precision`` after ``tc = config.train``), or ``None`` when it reads no config."""
    if chain[0] in aliases:
        chain = [*aliases[chain[0]], *chain[1:]]
    roots = [i for i, part in enumerate(chain) if part in CONFIG_NAMES]
    return ".".join(chain[roots[0] + 1 :]) if roots else None


def config_reads(source: str) -> list[tuple[int, str]]:
    """``(line, key)`` of every resolved key (:data:`RESOLVED_KEYS`) that ``source`` reads off a
    config object, through any alias (``m, t = config.model, config.train`` included)."""
    tree = ast.parse(source)
    aliases: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = (
                list(zip(target.elts, value.elts, strict=False))
                if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                else [(target, value)]
            )
            for name, val in pairs:
                chain = _chain(val)
                if isinstance(name, ast.Name) and chain and any(p in CONFIG_NAMES for p in chain):
                    aliases[name.id] = chain
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found = set()
    for node in ast.walk(tree):  # each whole chain once (not its prefixes)
        outer = isinstance(node, ast.Attribute) and id(node) not in inner
        chain = _chain(node) if outer else None
        key = _config_path(chain, aliases) if chain else None
        if key and any(key == k or key.startswith(k + ".") for k in RESOLVED_KEYS):
            found.add((node.lineno, key))
    return sorted(found)


def test_no_module_reads_a_resolved_fact_off_the_config_after_the_plan() -> None:
    """After ``resolve`` the plan is the only source of a run's resolved facts: the trainer,
    what a run keeps, the callbacks, the card and the composition root read the pooler, the
    LoRA targets, the device, the precision, the dev set and the objective section from the
    ``RunPlan``, never from the config (which ``resolve`` leaves as the user wrote it)."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(AFTER_THE_PLAN) and rel not in WHERE_RESOLVED:
            bad += [f"{rel}:{line}: {key}" for line, key in config_reads(path.read_text())]
    assert not bad, bad


def test_the_resolved_fact_check_can_fail() -> None:
    """Each way of reading a resolved key off the config is seen; the plan's are not."""
    source = (
        "def f(config, plan, self):\n"
        "    a = config.model.pooler\n"
        "    b = self.config.train.precision\n"
        "    tc = config.train\n"
        "    c = tc.device\n"
        "    m, t = config.model, config.eval\n"
        "    d = t.dev\n"
        "    e = config.objective.mntp.enabled\n"
        "    f = plan.pooler, plan.objective.mntp.enabled, config.train.lr, m.max_seq_len\n"
    )
    keys = [key for _, key in config_reads(source)]
    assert keys == [
        "model.pooler", "train.precision", "train.device", "eval.dev", "objective.mntp.enabled",
    ]  # fmt: skip


def test_the_trainer_only_loops() -> None:
    """The loop's bound: the trainer module at most 250 lines, its
    constructor at most 8 parameters and none of them the config (it is handed its
    collaborators, :func:`cselab.app.train.assemble_trainer` builds them)."""
    import inspect

    from cselab.training.trainer import Trainer

    path = SRC / "cselab" / "training" / "trainer.py"
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 250
    params = list(inspect.signature(Trainer.__init__).parameters)[1:]
    assert len(params) <= 8 and "config" not in params, params
