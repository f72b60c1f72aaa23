"""``L0_lifecycle``: model control (``none``, ``poll``, ``explicit``) and how a repository is read.

``test.sh`` starts a server for nearly every test of ``lifecycle_test.py``, each on a repository of its
own (``models``, sometimes a second one, ``models_0``), with folders and configuration files beside it
that the test copies in while the server runs. Each :class:`Run` here is one of those steps; its
``prepare`` lays out what ``test.sh`` does beyond the repository, in the suite's folder of the work copy,
again before each server (the tests move and delete files).

Most tests take TensorFlow and TensorRT models (``graphdef_*``, ``savedmodel_*``, ``plan_*``) for their
names, versions and outputs only: they are Python stand-ins on the configuration of the ONNX model of
the same types, an add/sub in version 1 and a sub/add in versions 2 and 3 (as ``gen_qa_models.py``
swaps them). ``onnx_*`` models are stand-ins too where a test needs only their names, so both servers
run it; the real ONNX model where the test sends ONNX itself (``backend: onnxruntime`` overrides, a
``model.onnx`` upload) or needs it to fail at load. Triton's ``identity`` and ``custom_zero_1_float32``
(C++ identity backend) are the runner's Python identity with their configuration, which also sleeps
for ``creation_delay_sec`` when it loads, as that backend does.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

from tools.triton_qa.suites import Edit, Model, Run, Suite, env, python_stand_in, register, with_edit

Build = Callable[[Model, Path], None]
F32 = "float32_float32_float32"
_HERE = "qa/L0_lifecycle"
# what test.sh leaves in the suite's folder between steps: removed before each layout
_LEFTOVERS = ("models_0", "models_v1", "models_v2", f"savedmodel_{F32}", "config.pbtxt.*")


def stand_in(base: str, types: str = F32, name: str = "") -> Model:
    """A Python stand-in for ``gen_qa_models.py``'s ``<base>_<types>``: add/sub in version 1, sub/add in
    versions 2 and 3."""
    return python_stand_in(name or f"{base}_{types}", types, {1: "addsub", 2: "subadd", 3: "subadd"})


def onnx_model(types: str = F32) -> Model:
    """``gen_qa_models.py``'s ONNX model ``onnx_<types>`` (tritonserver here cannot load it)."""
    return Model(f"onnx_{types}", "generated", f"qa_model_repository/onnx_{types}")


def ensemble(base: str) -> Model:
    """``gen_qa_models.py --ensemble``'s ``simple_<base>_float32_float32_float32`` (configuration)."""
    return Model(f"simple_{base}_{F32}", "generated", f"qa_ensemble_model_repository/simple_{base}_{F32}")


def identity(
    name: str = "identity_zero_1_int32", versions: tuple[str, ...] = ("1",), append: str = ""
) -> Model:
    """``qa/L0_lifecycle/identity_zero_1_int32`` (Triton's identity backend) as the runner's Python
    identity called ``name``, with empty ``versions`` folders as ``test.sh`` makes them: its code is in
    ``1/`` and every version names that file (``default_model_filename``), so a version folder needs no
    file of its own, as with the identity backend."""
    return Model(
        name,
        "folder",
        f"{_HERE}/identity_zero_1_int32",
        files=(("own:identity/1/model.py", "1/model.py"),),
        edits=(
            Edit("identity_zero_1_int32", name),
            Edit(r'^backend: "identity"', 'backend: "python"\ndefault_model_filename: "../1/model.py"'),
        ),
        append=append,
        version_folders=versions,
    )


def identity_fp32(
    name: str = "identity_fp32", *, config: bool = True, code: str = "", append: str = ""
) -> Model:
    """``qa/python_models/identity_fp32`` as ``name``: ``code`` added to its model's class, without its
    ``config.pbtxt`` where ``config`` is false (the backend completes it)."""
    files = (("model.py", "1/model.py"),) + ((("config.pbtxt", "config.pbtxt"),) if config else ())
    edits = (Edit("identity_fp32", name),) if config and name != "identity_fp32" else ()
    return Model(name, "python", "qa/python_models/identity_fp32", files=files, edits=edits, append=append)


def max_batch_1(model: Model) -> Model:
    """``sed -i "s/max_batch_size:.*/max_batch_size: 1/"`` on ``model``'s configuration."""
    return with_edit(model, Edit(r"max_batch_size:.*", "max_batch_size: 1"))


class Layout:
    """``test.sh``'s shell steps in the suite's folder (``root``): models, copies, ``sed``, ``rm``."""

    def __init__(self, root: Path, build: Build) -> None:
        self.root = root
        self.build = build
        for pattern in _LEFTOVERS:
            for path in root.glob(pattern):
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def models(self, folder: str, *models: Model) -> None:
        """``models`` built into ``root/folder`` (made if missing)."""
        (self.root / folder).mkdir(parents=True, exist_ok=True)
        for model in models:
            self.build(model, self.root / folder)

    def remove(self, *paths: str) -> None:
        """``rm -rf`` of each path (a trailing ``/*`` empties a folder, ``*/*`` every version's files)."""
        for rel in paths:
            for path in self.root.glob(rel):
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def sed(self, source: str, target: str, pattern: str = "", replacement: str = "") -> None:
        """``sed 's/pattern/replacement/' source > target`` (``pattern`` empty: ``cp``)."""
        text = (self.root / source).read_text()
        if pattern:
            text = "".join(re.sub(pattern, replacement, line, count=1) for line in text.splitlines(True))
        (self.root / target).write_text(text)

    def delete_lines(self, source: str, target: str, pattern: str) -> None:
        """``sed '/pattern/d' source > target``."""
        lines = (self.root / source).read_text().splitlines(True)
        (self.root / target).write_text("".join(x for x in lines if not re.search(pattern, x)))

    def move(self, source: str, target: str) -> None:
        """``mv source target``."""
        (self.root / source).rename(self.root / target)


def _prepare(steps: Callable[[Layout], None]) -> Callable[[Path, Build], None]:
    """A run's ``prepare``: clear what earlier steps left, then ``steps``."""

    def prepare(root: Path, build: Build) -> None:
        steps(Layout(root, build))

    return prepare


def _nothing(layout: Layout) -> None:
    """Only the repository (and the leftovers of earlier steps cleared)."""


_MODELS_0 = "--model-repository={qa}/L0_lifecycle/models_0"
_POLL = ("--model-control-mode=poll", "--repository-poll-secs=1")
_EXPLICIT = ("--model-control-mode=explicit",)
_NONE = ("--model-control-mode=none",)


def run(
    label: str,
    test: str,
    models: tuple[Model, ...],
    args: tuple[str, ...],
    steps: Callable[[Layout], None] = _nothing,
    **kw: object,
) -> Run:
    """One ``test.sh`` step: ``models`` in ``models/``, the server with ``args``, then ``test``."""
    return Run(
        label,
        "lifecycle_test.py",
        models,
        server_args=args,
        tests=(f"LifeCycleTest.{test}",),
        repository_at="models",
        prepare=_prepare(steps),
        timeout_s=600.0,
        **kw,  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------------- the steps beside models/
def _failing_graphdef(layout: Layout) -> None:
    layout.remove(f"models/graphdef_{F32}/3/*")
    layout.models("models_0", stand_in("onnx"), stand_in("plan"))


def _no_config(layout: Layout) -> None:
    layout.remove(f"models/graphdef_{F32}/config.pbtxt")
    layout.models("models_0", stand_in("onnx"), stand_in("plan"))


def _savedmodel_beside(layout: Layout) -> None:
    layout.models(".", stand_in("savedmodel"))


def _savedmodel_version(folder: str) -> Callable[[Layout], None]:
    def steps(layout: Layout) -> None:
        layout.move(f"models/savedmodel_{F32}/3", f"models/savedmodel_{F32}/{folder}")

    return steps


def _modify_configs(layout: Layout) -> None:
    for base in ("savedmodel", "plan"):
        config = f"models/{base}_{F32}/config.pbtxt"
        layout.delete_lines(config, f"config.pbtxt.{base}", r"^version_policy")
        layout.sed(config, f"config.pbtxt.wrong.{base}", "output0_labels", "wrong_output0_labels")
        labels = f"models/{base}_{F32}/output0_labels.txt"
        layout.sed(labels, f"models/{base}_{F32}/wrong_output0_labels.txt", "label", "label9")


def _two_repositories(layout: Layout) -> None:
    layout.models("models_0", stand_in("onnx"))
    layout.models(".", stand_in("savedmodel"))
    layout.remove(f"models/savedmodel_{F32}/3")


def _startup_models(layout: Layout) -> None:
    layout.models(
        "models_0", max_batch_1(ensemble("plan")), max_batch_1(ensemble("onnx")), stand_in("savedmodel")
    )


def _index_models(layout: Layout) -> None:
    layout.models("models_0", ensemble("graphdef"), ensemble("savedmodel"), stand_in("onnx"))


_VERSION_1 = "version_policy: { specific { versions: [1] }}\n"
_IDENTITY_CONFIG = "models/identity_zero_1_int32/config.pbtxt"


def _config_v2(layout: Layout) -> None:
    """``config.pbtxt.v2``: the identity's configuration serving version 2 only."""
    layout.delete_lines(_IDENTITY_CONFIG, "config.pbtxt.v2", r"^version_policy")
    path = layout.root / "config.pbtxt.v2"
    path.write_text(path.read_text() + "version_policy: { specific { versions: [2] }}\n")


def _config_new(layout: Layout) -> None:
    """``config.pbtxt.new``: the identity's configuration as it is (a reload of an unchanged model)."""
    layout.sed(_IDENTITY_CONFIG, "config.pbtxt.new")


def _concurrent_v2(layout: Layout) -> None:
    layout.models("models_v2", identity_fp32("identity_model"))


def _custom_configs(layout: Layout) -> None:
    layout.remove(f"models/savedmodel_{F32}/configs")
    (layout.root / f"models/savedmodel_{F32}/configs").mkdir()
    layout.sed(
        f"models/savedmodel_{F32}/config.pbtxt",
        "config.pbtxt.custom.savedmodel",
        r"^version_policy:.*",
        "version_policy: { specific: { versions: [2] }}",
    )


def _custom_config_in_place(layout: Layout) -> None:
    _custom_configs(layout)
    layout.move("config.pbtxt.custom.savedmodel", f"models/savedmodel_{F32}/configs/custom.pbtxt")


def _only_version_2(layout: Layout) -> None:
    layout.remove(f"models/onnx_{F32}/1/*", f"models/onnx_{F32}/3/*")


def _no_version_1(layout: Layout) -> None:
    layout.remove(f"models/onnx_{F32}/1")


def _onnx_files_only(layout: Layout) -> None:
    layout.remove(f"models/onnx_{F32}/config.pbtxt", f"models/onnx_{F32}/2", f"models/onnx_{F32}/3")
    layout.remove(f"models/onnx_{F32}/output0_labels.txt")


_SLEEP = "    def initialize(self, args):\n        import time\n        time.sleep({})\n"
_LOG_VERSION = (
    "    def initialize(self, args):\n"
    "        pb_utils.Logger.log_info(f'[PB model] Loading version {args[\"model_version\"]}')\n"
)


def _python_code(model: Model, code: str, folders: tuple[str, ...] = ("1",)) -> Callable[[Layout], None]:
    """``echo <code> >> <folder>/model.py`` for a Python model's version folders."""

    def steps(layout: Layout) -> None:
        for folder in folders:
            path = layout.root / "models" / model.name / folder / "model.py"
            path.write_text(path.read_text() + code)

    return steps


def _steps(*parts: Callable[[Layout], None]) -> Callable[[Layout], None]:
    def steps(layout: Layout) -> None:
        for part in parts:
            part(layout)

    return steps


def _python_identity_copies(layout: Layout) -> None:
    _python_code(identity_fp32("python_identity_fp32_1"), _SLEEP.format(10))(layout)
    _python_code(identity_fp32("python_identity_fp32_2"), _SLEEP.format(10))(layout)


def _versions_2_3(layout: Layout) -> None:
    model = layout.root / "models" / "identity_fp32"
    for version in ("2", "3"):
        shutil.copytree(model / "1", model / version)
    _python_code(identity_fp32(), _LOG_VERSION, ("1", "2", "3"))(layout)


def _custom_zero(name: str = "custom_zero_1_float32", delay: str = "10") -> Model:
    return Model(
        name,
        "folder",
        "qa/custom_models/custom_zero_1_float32",
        files=(("own:identity/1/model.py", "1/model.py"),),
        edits=(Edit(r'^backend: "identity"', 'backend: "python"'),),
        append=f'parameters [\n{{ key: "creation_delay_sec"; value: {{ string_value: "{delay}" }}}}\n]\n',
    )


def _identity_no_delay() -> Model:
    return with_edit(identity(), Edit(r'string_value: "10"', 'string_value: "0"'))


_ENSEMBLE_ZERO = Model(
    "ensemble_zero_1_float32", "folder", f"{_HERE}/ensemble_zero_1_float32", version_folders=("1",)
)
_GPU = "needs a GPU"
_LOG = "test.sh greps the server's log or checks its exit; not a Python test"


def _runs() -> tuple[Run, ...]:
    graphdef, savedmodel, plan, onnx = (stand_in(b) for b in ("graphdef", "savedmodel", "plan", "onnx"))
    runs = [
        run(
            "parse_error_modelfail_nostrict",
            "test_parse_error_modelfail_nostrict",
            (graphdef, savedmodel),
            (_MODELS_0, "--exit-on-error=false", "--strict-readiness=false"),
            _failing_graphdef,
        ),
        run(
            "parse_error_no_model_config",
            "test_parse_error_no_model_config",
            (graphdef, savedmodel),
            (_MODELS_0, "--exit-on-error=false", "--strict-model-config=true"),
            _no_config,
        ),
        run(
            "parse_error_model_no_version",
            "test_parse_error_model_no_version",
            (savedmodel, onnx, plan, graphdef),
            ("--exit-on-error=false",),
            lambda layout: layout.remove(
                f"models/graphdef_{F32}/[0-9]*", f"models/graphdef_{F32}/output0_labels.txt"
            ),
        ),
        run(
            "parse_ignore_zero_prefixed_version",
            "test_parse_ignore_zero_prefixed_version",
            (savedmodel,),
            ("--exit-on-error=false",),
            _savedmodel_version("003"),
        ),
        run(
            "parse_ignore_non_intergral_version",
            "test_parse_ignore_non_intergral_version",
            (savedmodel,),
            ("--exit-on-error=false",),
            _savedmodel_version("abc"),
        ),
        run(
            "dynamic_model_load_unload",
            "test_dynamic_model_load_unload",
            (graphdef, onnx, plan),
            _POLL,
            _savedmodel_beside,
        ),
        run(
            "dynamic_model_load_unload_disabled",
            "test_dynamic_model_load_unload_disabled",
            (graphdef, onnx, plan),
            _NONE,
            _savedmodel_beside,
        ),
        run(
            "dynamic_version_load_unload",
            "test_dynamic_version_load_unload",
            (stand_in("graphdef", "int32_int32_int32"),),
            _POLL,
        ),
        run(
            "dynamic_version_load_unload_disabled",
            "test_dynamic_version_load_unload_disabled",
            (stand_in("graphdef", "int32_int32_int32"),),
            _NONE,
        ),
        run("dynamic_model_modify", "test_dynamic_model_modify", (savedmodel, plan), _POLL, _modify_configs),
        run(
            "dynamic_file_delete",
            "test_dynamic_file_delete",
            (savedmodel, plan),
            (*_POLL, "--strict-model-config=false"),
        ),
        run(
            "multiple_model_repository_polling",
            "test_multiple_model_repository_polling",
            (graphdef, savedmodel),
            (_MODELS_0, *_POLL),
            _two_repositories,
        ),
        run(
            "multiple_model_repository_control",
            "test_multiple_model_repository_control",
            (graphdef, savedmodel),
            (_MODELS_0, *_EXPLICIT),
            _two_repositories,
        ),
        *(
            run(
                name,
                f"test_{name}",
                (max_batch_1(onnx), max_batch_1(ensemble("onnx"))),
                (*_EXPLICIT, "--strict-model-config=false"),
            )
            for name in ("model_control", "model_control_ensemble")
        ),
        run(
            "model_control_fail",
            "test_model_control_fail",
            (max_batch_1(onnx),),
            (*_EXPLICIT, "--strict-model-config=false"),
            lambda layout: layout.remove(f"models/onnx_{F32}/*/*"),
        ),
        run(
            "multiple_model_repository_control_startup_models",
            "test_multiple_model_repository_control_startup_models",
            (max_batch_1(plan), max_batch_1(onnx), savedmodel),
            (
                _MODELS_0,
                *_EXPLICIT,
                "--strict-model-config=false",
                f"--load-model=savedmodel_{F32}",
                f"--load-model=plan_{F32}",
                f"--load-model=simple_onnx_{F32}",
            ),
            _startup_models,
        ),
        run(
            "multiple_model_repository_control_startup_models (--load-model=*)",
            "test_multiple_model_repository_control_startup_models",
            (max_batch_1(plan), max_batch_1(onnx), savedmodel),
            (_MODELS_0, *_EXPLICIT, "--strict-model-config=false", "--load-model=*"),
            _startup_models,
        ),
        run(
            "model_repository_index",
            "test_model_repository_index",
            (graphdef, savedmodel, onnx),
            (
                _MODELS_0,
                *_EXPLICIT,
                "--strict-model-config=false",
                f"--load-model=onnx_{F32}",
                f"--load-model=graphdef_{F32}",
                f"--load-model=simple_savedmodel_{F32}",
            ),
            _index_models,
        ),
    ]
    reload_args = (*_EXPLICIT, "--strict-model-config=false", "--load-model=identity_zero_1_int32")
    for protocol in ("grpc", "http"):
        variables = env(TRITONSERVER_USE_GRPC="1") if protocol == "grpc" else env()
        runs += [
            run(
                f"model_availability_on_reload{suffix} ({protocol})",
                f"test_model_availability_on_reload{suffix}",
                (identity(versions=("1", "2"), append=_VERSION_1) if suffix else identity(),),
                reload_args,
                steps,
                env=variables,
            )
            for suffix, steps in (("", _nothing), ("_2", _config_v2), ("_3", _config_new))
        ]
    runs += [
        run(
            "config_override",
            "test_config_override",
            (onnx_model(),),
            ("--model-repository={qa}/L0_lifecycle/models", *_EXPLICIT, "--strict-model-config=false"),
            _only_version_2,
        ),
        Run(
            "file_override",
            "lifecycle_test.py",
            (onnx_model(),),
            server_args=(
                *_EXPLICIT,
                f"--load-model=onnx_{F32}",
                "--strict-model-config=false",
                "this:--allow-model-file-upload",
            ),
            tests=("LifeCycleTest.test_file_override", "LifeCycleTest.test_file_override_security"),
            repository_at="models",
            prepare=_prepare(_no_version_1),
            timeout_s=600.0,
        ),
        run(
            "concurrent_model_load_speedup",
            "test_concurrent_model_load_speedup",
            (
                identity("identity_zero_1_int32_1"),
                identity("identity_zero_1_int32_2"),
                identity_fp32("python_identity_fp32_1"),
                identity_fp32("python_identity_fp32_2"),
            ),
            _EXPLICIT,
            _python_identity_copies,
        ),
        run(
            "concurrent_model_load",
            "test_concurrent_model_load",
            (identity("identity_model"),),
            _EXPLICIT,
            _concurrent_v2,
        ),
        run(
            "concurrent_model_load_unload",
            "test_concurrent_model_load_unload",
            (identity(), _ENSEMBLE_ZERO, _custom_zero()),
            _EXPLICIT,
        ),
        run(
            "concurrent_same_model_load_unload_stress",
            "test_concurrent_same_model_load_unload_stress",
            (_identity_no_delay(),),
            (*_EXPLICIT, "--model-load-thread-count=32"),
        ),
        run(
            "concurrent_model_instance_load_speedup",
            "test_concurrent_model_instance_load_speedup",
            (identity_fp32(config=False),),
            _EXPLICIT,
            _python_code(identity_fp32(), _SLEEP.format(10)),
        ),
        run(
            "concurrent_model_instance_load_sanity",
            "test_concurrent_model_instance_load_sanity",
            (identity_fp32(f"python_{F32}", config=False), onnx_model()),
            _EXPLICIT,
            _onnx_files_only,
            env=env(PARALLEL_BACKENDS="python onnx"),
        ),
        run(
            "model_config_overwrite",
            "test_model_config_overwite",
            (identity_fp32(config=False),),
            (*_EXPLICIT, "--load-model=identity_fp32"),
            _python_code(identity_fp32(), _SLEEP.format(5)),
        ),
        run(
            "add_custom_config",
            "test_add_custom_config",
            (savedmodel,),
            (*_POLL, "--model-config-name=custom"),
            _custom_configs,
        ),
        run(
            "delete_custom_config",
            "test_delete_custom_config",
            (savedmodel,),
            (*_POLL, "--model-config-name=custom"),
            _custom_config_in_place,
        ),
        run(
            "load_new_model_version",
            "test_load_new_model_version",
            (identity_fp32(append="version_policy: { specific: { versions: [1, 2] } }\n"),),
            (*_EXPLICIT, "--load-model=*"),
            _versions_2_3,
            env=env(PYTHONDONTWRITEBYTECODE="True"),
        ),
    ]
    return tuple(runs)


L0_LIFECYCLE = Suite(
    "L0_lifecycle",
    _runs(),
    (
        (
            "LifeCycleTest.test_parse_error_noexit (4 starts)",
            "the server has no repository it can read and never becomes live; the runner starts a "
            "server and waits until it is ready",
        ),
        (
            "LifeCycleTest.test_parse_error_modelfail (--strict-readiness=true)",
            "a model fails to load, so the server is never ready; the runner waits until it is",
        ),
        ("LifeCycleTest.test_init_error_modelfail", "the same: the server is never ready (strict readiness)"),
        ("port collision steps, --load-model=* with another --load-model, a missing startup model", _LOG),
        ("curl checks (control API in poll mode, invalid endpoints, load retries)", "shell steps"),
        (
            "LifeCycleTest.test_model_reload_fail",
            "its version 2 asks for KIND_GPU instances and test.sh greps the log for the failure; " + _GPU,
        ),
        (
            "LifeCycleTest.test_load_same_model_different_platform",
            "TensorRT and LibTorch models of the same name",
        ),
        (
            "LifeCycleTest.test_shutdown_dynamic / _sequence / _ensemble / _with_live_connection",
            "the test sends SIGINT to the server's pid (SERVER_PID) and test.sh greps its log",
        ),
        (
            "LifeCycleTest.test_shutdown_while_background_unloading / _while_loading",
            "test.sh counts lines of tritonserver's own log",
        ),
        ("LifeCycleTest.test_load_gpu_limit", _GPU + " (--model-load-gpu-limit, cuda-python)"),
        (
            "models graphdef_*, savedmodel_*, plan_*, identity_zero_1_int32, custom_zero_1_float32",
            "TensorFlow, TensorRT and Triton's C++ identity backend: Python stand-ins with the same "
            "configuration, on both servers (module docstring of tools/triton_qa/lifecycle.py)",
        ),
        (
            "onnx_float32_float32_float32 in config_override, file_override, concurrent_model_instance_load_sanity",
            "real ONNX models (the tests override to, or upload, ONNX): the tritonserver here has the "
            "Python backend only",
        ),
    ),
)

register(L0_LIFECYCLE)
