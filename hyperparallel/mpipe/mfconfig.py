"""MindFormers' own ``MindFormerConfig`` for recipe files, without importing MindSpore.

Recipes are MindFormers YAML. ``base_config`` inheritance must behave exactly as in
MindFormers, so when MindFormers is installed we load recipes with its own class,
``mindformers.tools.register.MindFormerConfig``: ``MindFormerConfig._file2dict``
(read the file, load its ``base_config`` parents, merge) and ``MindFormerConfig(**d)``.

``import mindformers`` imports MindSpore (its package ``__init__`` and
``mindformers/tools/check_rules.py`` do), and ``hyperparallel plan/check/simulate``
must never import MindSpore. So the installed file ``mindformers/tools/register/config.py``
is executed standalone, under a private module name, with the two things it imports
provided without MindSpore:

* ``check_yaml_depth_before_loading`` (and the helpers it calls): the functions are
  taken from the installed ``mindformers/tools/check_rules.py`` source (``ast``) and
  executed alone, without that module's MindSpore import;
* ``ConfigTemplate`` from ``mindformers/tools/register/template.py``, loaded the same
  way with ``mindformers.tools.logger`` replaced by a ``logging`` logger.

The stand-in ``mindformers*`` entries exist in ``sys.modules`` only while those two
files execute and are removed afterwards; nothing named ``mindformers`` or
``mindspore`` stays imported. If MindFormers is already imported (a MindSpore
process), its real class is used. If MindFormers is not installed, or its files do
not have the expected shape, :func:`load_config_dict` returns ``None`` and the caller
uses the built-in loader (``recipe._load_yaml``), which implements the same merge.

``MindFormerConfig(path)`` itself (a file argument) also applies MindFormers'
``ConfigTemplate``: it fills every known section with MindFormers' defaults and rejects
keys it does not know in ``parallel_config`` (MindFormers 1.9 keeps ``pp_interleave_num``
in ``model.model_config``). The planner does not need those defaults, so recipes are
loaded without the template; :func:`template_check` applies it on request (tests use it
to show the shipped Ascend recipes are valid MindFormers configs).
"""
from __future__ import annotations

import ast
import copy
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
import types
from typing import Optional

import yaml

_LOCK = threading.Lock()
_CACHE: dict = {}
_PRIVATE = "_hyperparallel_mindformers_register"
logger = logging.getLogger("hyperparallel.mfconfig")

#: ``HYPERPARALLEL_RECIPE_LOADER``: ``auto`` (MindFormers if installed, else built-in),
#: ``mindformers`` (require it), ``builtin`` (never use it).
LOADER_ENV = "HYPERPARALLEL_RECIPE_LOADER"


def mindformers_dir() -> Optional[str]:
    """Folder of the installed ``mindformers`` package, found without importing it."""
    mod = sys.modules.get("mindformers")
    if mod is not None and getattr(mod, "__file__", None):
        return os.path.dirname(mod.__file__)
    # PathFinder only locates the top-level package; it runs no package code.
    spec = importlib.machinery.PathFinder.find_spec("mindformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def mindformers_version() -> Optional[str]:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("mindformers")
    except Exception:  # noqa: BLE001 - metadata absent or broken: treat as not installed
        return None


def _depth_check_from_source(check_rules_py: str):
    """``check_yaml_depth_before_loading`` taken from MindFormers' source, run without MindSpore."""
    with open(check_rules_py, encoding="utf-8") as f:
        tree = ast.parse(f.read(), check_rules_py)
    wanted = {"get_yaml_ast_depth", "check_yaml_depth_before_loading", "YAML_MAX_NESTING_DEPTH"}
    body = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            body.append(node)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in wanted for t in node.targets):
            body.append(node)
    names = {getattr(n, "name", None) for n in body} | {t.id for n in body if isinstance(n, ast.Assign)
                                                        for t in n.targets if isinstance(t, ast.Name)}
    if not wanted <= names:
        raise ImportError(f"{check_rules_py}: expected {sorted(wanted)}, found {sorted(n for n in names if n)}")
    ns = {"yaml": yaml, "MappingNode": yaml.nodes.MappingNode, "__name__": _PRIVATE + ".check_rules"}
    exec(compile(ast.Module(body=body, type_ignores=[]), check_rules_py, "exec"), ns)  # noqa: S102
    return ns["check_yaml_depth_before_loading"]


def _exec_file(name: str, path: str, package: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = package
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _standalone_register(root: str) -> types.ModuleType:
    """Execute ``tools/register/config.py`` (and ``template.py``) without the mindformers package."""
    reg = os.path.join(root, "tools", "register")
    depth_check = _depth_check_from_source(os.path.join(root, "tools", "check_rules.py"))
    stubs = {
        "mindformers": types.ModuleType("mindformers"),
        "mindformers.tools": types.ModuleType("mindformers.tools"),
        "mindformers.tools.check_rules": types.ModuleType("mindformers.tools.check_rules"),
    }
    stubs["mindformers"].__path__ = []  # a package, so submodule imports resolve to the stubs
    stubs["mindformers.tools"].__path__ = []
    stubs["mindformers"].tools = stubs["mindformers.tools"]
    stubs["mindformers.tools"].logger = logging.getLogger("mindformers")
    stubs["mindformers.tools"].check_rules = stubs["mindformers.tools.check_rules"]
    stubs["mindformers.tools.check_rules"].check_yaml_depth_before_loading = depth_check
    pkg = types.ModuleType(_PRIVATE)
    pkg.__path__ = [reg]
    added = []
    try:
        for name, mod in list(stubs.items()) + [(_PRIVATE, pkg)]:
            if name in sys.modules:
                raise ImportError(f"{name} is already imported")
            sys.modules[name] = mod
            added.append(name)
        added.append(_PRIVATE + ".template")
        _exec_file(_PRIVATE + ".template", os.path.join(reg, "template.py"), _PRIVATE)
        added.append(_PRIVATE + ".config")
        cfg = _exec_file(_PRIVATE + ".config", os.path.join(reg, "config.py"), _PRIVATE)
    finally:
        for name in added:
            sys.modules.pop(name, None)
    for attr in ("MindFormerConfig", "BASE_CONFIG"):
        if not hasattr(cfg, attr):
            raise ImportError(f"{reg}/config.py has no {attr}")
    if not hasattr(cfg.MindFormerConfig, "_file2dict"):
        raise ImportError(f"{reg}/config.py: MindFormerConfig has no _file2dict")
    return cfg


def config_module() -> Optional[types.ModuleType]:
    """MindFormers' ``tools.register.config`` module (real if imported, else standalone), or None."""
    mode = os.environ.get(LOADER_ENV, "auto")
    if mode == "builtin":
        return None
    with _LOCK:
        if "module" not in _CACHE:
            _CACHE["module"], _CACHE["why"] = _find_module()
        mod, why = _CACHE["module"], _CACHE["why"]
    if mod is None and mode == "mindformers":
        from .errors import SpecError
        raise SpecError("recipe", f"{LOADER_ENV}=mindformers but {why}")
    return mod


def _find_module():
    """(module, '') or (None, why not)."""
    real = sys.modules.get("mindformers.tools.register.config")
    if real is None and "mindformers" in sys.modules:
        # MindFormers (hence MindSpore) is already imported here: use it as it is.
        try:
            real = importlib.import_module("mindformers.tools.register.config")
        except ImportError as e:
            return None, f"mindformers is imported but its config module is not: {e}"
    if real is not None:
        return real, ""
    root = mindformers_dir()
    if root is None:
        return None, "mindformers is not installed"
    try:
        return _standalone_register(root), ""
    except (ImportError, OSError, SyntaxError, AttributeError) as e:
        return None, f"mindformers at {root} could not be loaded standalone: {e}"


def why_builtin() -> str:
    """Why the built-in loader is in use ('' when MindFormers' class is)."""
    config_module()
    return _CACHE.get("why", "")


def to_plain(obj):
    """MindFormerConfig / OrderedDict trees to plain dicts and lists."""
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    return obj


def load_config_dict(path: str) -> Optional[dict]:
    """The recipe at ``path`` with its ``base_config`` parents merged by MindFormerConfig, or None.

    None means MindFormers is not available; the caller falls back to its own loader.
    Errors of the file (missing, bad YAML, too deep) are raised as SpecError.
    """
    mod = config_module()
    if mod is None:
        return None
    from .errors import SpecError
    MFC = mod.MindFormerConfig
    try:
        merged = MFC._file2dict(path)
        cfg = MFC(**dict(merged))
    except FileNotFoundError as e:
        raise SpecError("recipe", f"file not found: {e.filename}") from None
    except yaml.YAMLError as e:
        raise SpecError("recipe", f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    except ValueError as e:  # MindFormers' YAML depth/parse check
        raise SpecError("recipe", f"{path}: {str(e).splitlines()[0]}") from None
    except (AttributeError, TypeError) as e:  # e.g. a file that is not a mapping
        raise SpecError("recipe", f"{path} must be a YAML mapping ({e})") from None
    return to_plain(cfg)


def template_check(raw: dict, run_mode: str = "train") -> dict:
    """Apply MindFormers' ``ConfigTemplate`` to a copy of ``raw`` (as ``MindFormerConfig(path)`` does).

    Returns the completed config (MindFormers' defaults filled in); raises KeyError or
    ValueError as MindFormers would. Needs MindFormers installed.
    """
    mod = config_module()
    if mod is None:
        raise RuntimeError(f"MindFormers is not available: {why_builtin()}")
    cfg = copy.deepcopy(to_plain(raw))
    cfg.setdefault("run_mode", run_mode)
    logging.getLogger("mindformers").disabled = True  # "useless config" warnings for mpipe:, device:
    try:
        mod.ConfigTemplate.apply_template(cfg)
    finally:
        logging.getLogger("mindformers").disabled = False
    return to_plain(cfg)
