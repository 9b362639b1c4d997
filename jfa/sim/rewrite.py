"""Source rewrite of ``@triton.jit`` functions for the simulator.

Triton's interpreter runs a kernel as Python after one AST rewrite (every assignment goes through
``interpreter_semantic.to_tensor``). The simulator applies the same rewrite and one more: each
``with tlx.async_tasks():`` region becomes a set of closures, one per ``with tlx.async_task(...):``
block, handed to the simulator's scheduler, which runs them as concurrent tasks::

    with tlx.async_tasks():                     __jfa_env_1 = dict(locals())
        with tlx.async_task("default"):         __jfa_specs_1 = []
            BODY0                      ==>      def __jfa_task_1_0():
        with tlx.async_task(num_warps=4,            <names BODY0 assigns, copied from __jfa_env_1>
                            replicate=2):           BODY0
            BODY1                               __jfa_specs_1.append(__jfa_sim.task(...fn=__jfa_task_1_0))
                                                ... (the same for BODY1)
                                                __jfa_sim.run_tasks(__jfa_specs_1)

A task starts from the values the kernel's variables had when the region began (its own registers):
names it assigns are local to it, names it only reads are the kernel's. Inside ``async_tasks()`` only
``async_task`` blocks and (constexpr) ``if`` statements around them are allowed.

The rewritten function is built inside a factory whose parameters are the two names the rewritten code
needs (``__jfa_sim``, ``interpreter_semantic``), so nothing is added to the kernel module's globals.
Every code object compiled here is registered with ``source`` as kernel code, so ops can name the
kernel's lines. Rewrites are cached per function.
"""
from __future__ import annotations

import __future__
import ast
import inspect
import os
import textwrap

import triton
from triton.runtime import interpreter as _interp

from . import source

_CACHE: dict = {}  # original python function -> rewritten function


class RewriteError(Exception):
    pass


def _call_name(expr):
    if not isinstance(expr, ast.Call):
        return None
    f = expr.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return None


def _at_line(tree, line, skip=()):
    """Place a generated statement on one source line (a span would move method calls to its last line)."""
    for sub in ast.walk(tree):
        if id(sub) in skip or not hasattr(sub, "_attributes") or "lineno" not in sub._attributes:
            continue
        sub.lineno = sub.end_lineno = line
        sub.col_offset = sub.end_col_offset = 0


def _is_with_of(node, name):
    return isinstance(node, ast.With) and len(node.items) == 1 and _call_name(node.items[0].context_expr) == name


class _Lowering(_interp.ASTTransformer):
    """The interpreter's transformer plus the lowering of ``async_tasks`` regions."""

    def __init__(self, filename: str, fname: str):
        super().__init__()
        self.filename, self.fname = filename, fname
        self.regions = 0
        self.task_names: dict = {}  # closure name -> display label

    def visit_With(self, node):
        if _is_with_of(node, "async_tasks"):
            return self._lower(node)
        for item in node.items:
            if _call_name(item.context_expr) == "async_task":
                raise RewriteError(f"{self.filename}:{node.lineno}: tlx.async_task outside tlx.async_tasks()")
        return self.generic_visit(node)

    def _lower(self, node):
        self.regions += 1
        k = self.regions
        env, specs = f"__jfa_env_{k}", f"__jfa_specs_{k}"
        out = ast.parse(f"{env} = dict(locals())\n{specs} = []").body
        counter = [0]
        out += self._lower_body(node.body, env, specs, k, counter)
        out += ast.parse(f"__jfa_sim.run_tasks({specs})").body
        for stmt in out[:2] + out[-1:]:  # the generated statements: at the `with tlx.async_tasks()` line
            _at_line(stmt, node.lineno)
        return out

    def _lower_body(self, stmts, env, specs, k, counter):
        out = []
        for st in stmts:
            if _is_with_of(st, "async_task"):
                j = counter[0]
                counter[0] += 1
                ctx = st.items[0].context_expr
                body = [self.visit(s) for s in st.body]
                body = [s for b in body for s in (b if isinstance(b, list) else [b])]
                assigned = sorted({n.id for b in body for n in ast.walk(b)
                                   if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
                prefill = []
                for name in assigned:
                    prefill += ast.parse(f"if {name!r} in {env}: {name} = {env}[{name!r}]").body
                fname = f"__jfa_task_{k}_{j}"
                fdef = ast.FunctionDef(name=fname, args=ast.arguments(posonlyargs=[], args=[], vararg=None,
                                                                      kwonlyargs=[], kw_defaults=[], kwarg=None,
                                                                      defaults=[]),
                                       body=prefill + body, decorator_list=[], returns=None, type_comment=None)
                if hasattr(ast, "TypeVar"):  # Python >= 3.12
                    fdef.type_params = []
                spec = ast.Call(func=ast.Attribute(ast.Name("__jfa_sim", ast.Load()), "task", ast.Load()),
                                args=[ast.Constant(k), ast.Constant(j), ast.Constant(st.lineno)] + list(ctx.args),
                                keywords=list(ctx.keywords) + [ast.keyword("fn", ast.Name(fname, ast.Load()))])
                reg = ast.Expr(ast.Call(func=ast.Attribute(ast.Name(specs, ast.Load()), "append", ast.Load()),
                                        args=[spec], keywords=[]))
                ast.copy_location(fdef, st)
                for s in prefill:
                    _at_line(s, st.lineno)
                user = {id(n) for a in list(ctx.args) + [k.value for k in ctx.keywords] for n in ast.walk(a)}
                _at_line(reg, st.lineno, skip=user)
                self.task_names[fname] = f"{self.fname} [async_task at line {st.lineno}]"
                out += [fdef, reg]
            elif isinstance(st, ast.If):  # a (constexpr) guard around async_task blocks
                body = self._lower_body(st.body, env, specs, k, counter) or [ast.Pass()]
                orelse = self._lower_body(st.orelse, env, specs, k, counter)
                test = self.visit(st.test)
                out.append(ast.copy_location(ast.If(test=test, body=body, orelse=orelse), st))
            elif isinstance(st, (ast.Pass, ast.Expr)) and (isinstance(st, ast.Pass) or isinstance(st.value, ast.Constant)):
                continue  # pass, docstrings and comments-as-strings
            else:
                raise RewriteError(f"{self.filename}:{st.lineno}: inside tlx.async_tasks() only `with tlx.async_task(...)`"
                                   " blocks (and if statements around them) are allowed")
        return out


_TRITON_DIR = os.path.dirname(os.path.abspath(triton.__file__))


def _register_codes(code, names: dict, top: bool = True) -> None:
    """Register the compiled functions as kernel code (Triton's own library functions are not: a report's
    innermost kernel frame is the user's)."""
    for const in code.co_consts:
        if inspect.iscode(const):
            if not top or const.co_name != "__jfa_sim_factory":
                source.register_code(const, names.get(const.co_name, const.co_name))
            _register_codes(const, names, False)


def rewritten(fn):
    """The simulator's rewrite of the python function ``fn`` (cached)."""
    try:
        return _CACHE[fn]
    except KeyError:
        pass
    _CACHE[fn] = out = _rewrite(fn)
    return out


def _rewrite(fn):
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        raise RewriteError(f"cannot read the source of {fn!r}: {exc}") from exc
    filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
    tree = ast.parse(textwrap.dedent("".join(lines)))
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if not defs:
        raise RewriteError(f"{filename}:{start}: no function definition found for {fn.__name__}")
    fdef = defs[0]
    fdef.decorator_list = []
    ast.increment_lineno(tree, start - 1)
    lowering = _Lowering(filename, fn.__name__)
    fdef = lowering.visit(fdef)
    factory = ast.FunctionDef(
        name="__jfa_sim_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg("__jfa_sim"), ast.arg("interpreter_semantic")], vararg=None,
                           kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
        body=[fdef, ast.Return(ast.Name(fn.__name__, ast.Load()))], decorator_list=[], returns=None,
        type_comment=None)
    if hasattr(ast, "TypeVar"):
        factory.type_params = []
    ast.copy_location(factory, fdef)
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    if not os.path.abspath(filename).startswith(_TRITON_DIR + os.sep):
        _register_codes(code, lowering.task_names)
    namespace: dict = {}
    exec(code, fn.__globals__, namespace)
    from . import runtime
    out = namespace["__jfa_sim_factory"](runtime.TRAMPOLINE, _interp.interpreter_semantic)
    out.__jfa_sim_original__ = fn
    return out
