"""docker/ without a Docker engine: the compose file and both Dockerfiles, parsed and checked against the code.

Every service is there; every ``tunebank`` command they run parses with the real CLI (command, options and values);
every ``TUNEBANK_*`` variable is a real setting and its value validates; volumes are declared, shared where they must
be, and hold the data dir and CuPy's cache; the API's port agrees across compose, ``serve --port``, ``EXPOSE`` and the
health check; torch is pinned as in constraints.txt (CPU index for the API, CUDA for the worker)."""

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from service.crawl_schedule import cron_trigger
from tunebank.cli import app
from tunebank.server_settings import ServerSettings

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
TUNEBANK_SERVICES = ("migrate", "api", "worker", "crawler")
ENV = {"POSTGRES_PASSWORD": "s3cret"}  # what docker/.env gives compose in this test
SETTINGS = {f"TUNEBANK_{name.upper()}": name for name in ServerSettings.model_fields}  # Settings' and the server's
DATA = "/data"


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}`` and ``$$`` in every string of ``value``."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise AssertionError(f"compose would refuse: {arg}")
        return arg if op == ":-" else ""

    return re.sub(r"\$\$|\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)


def compose(env: dict[str, str] = ENV) -> dict[str, Any]:
    return interpolate(yaml.safe_load((DOCKER / "compose.yaml").read_text()), env)


def dockerfile(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, ARG defaults substituted."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in (DOCKER / name).read_text().splitlines()
                                           if not line.lstrip().startswith("#")))
    args: dict[str, str] = {}
    out = []
    for line in filter(str.strip, text.splitlines()):
        instruction, _, rest = line.strip().partition(" ")
        rest = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest.strip())
        if instruction.upper() == "ARG" and "=" in rest:
            key, _, default = rest.partition("=")
            args[key] = default
        out.append((instruction.upper(), rest))
    return out


def instructions(name: str, kind: str) -> list[str]:
    return [rest for instruction, rest in dockerfile(name) if instruction == kind]


def parse_cli(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse ``argv`` (``tunebank ...``) with the real CLI: the command's name and its parsed options."""
    assert argv[0] == "tunebank", argv
    command: Any = typer.main.get_command(app)
    words = list(argv[1:])
    path = []
    while hasattr(command, "commands"):
        assert words and words[0] in command.commands, f"`tunebank {' '.join(path + words[:1])}` is no command"
        path.append(words.pop(0))
        command = command.commands[path[-1]]
    return " ".join(path), command.make_context(" ".join(path), words).params


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    return dict(item.split("=", 1) for item in env) if isinstance(env, list) else {k: str(v) for k, v in env.items()}


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source (named volume or host path) of a service's volumes (short syntax)."""
    out = {}
    for spec in service.get("volumes") or []:
        source, target, *_ = spec.split(":")
        out[target] = source
    return out


def test_every_service_is_there():
    services = compose()["services"]
    assert set(services) >= {"api", "worker", "crawler", "postgres", "redis", "migrate"}
    for name in ("api", "migrate"):
        assert services[name]["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    for name in ("worker", "crawler"):
        assert services[name]["build"] == {"context": "..", "dockerfile": "docker/Dockerfile.worker"}
    for name, spec in services.items():
        assert "build" in spec or "image" in spec, name
        assert (DOCKER / spec["build"]["context"] / spec["build"]["dockerfile"]).is_file() if "build" in spec else True


def test_every_command_parses_with_the_cli():
    services = compose()["services"]
    commands = {name: parse_cli(services[name]["command"]) for name in TUNEBANK_SERVICES}
    assert commands["migrate"][0] == "db upgrade"
    assert commands["api"][0] == "serve" and commands["api"][1]["host"] == "0.0.0.0"
    assert commands["worker"][0] == "worker"
    crawl, options = commands["crawler"]
    assert crawl == "crawl" and options["backend"] == "cuda"
    cron_trigger(options["schedule_"])  # a cron expression the crawler accepts
    cron_trigger(parse_cli(compose({**ENV, "CRAWL_SCHEDULE": "30 3 * * 1"})["services"]["crawler"]["command"])[1]
                 ["schedule_"])
    for name in ("Dockerfile", "Dockerfile.worker"):
        (cmd,) = instructions(name, "CMD")
        parse_cli(yaml.safe_load(cmd))  # a JSON array (exec form), which YAML reads too


@pytest.mark.parametrize("service", TUNEBANK_SERVICES)
def test_environment_names_real_settings_with_valid_values(service):
    env = env_of(compose()["services"][service])
    tunebank = {k: v for k, v in env.items() if k.startswith("TUNEBANK_")}
    unknown = sorted(set(tunebank) - set(SETTINGS))
    assert not unknown, f"{unknown} are not settings of tunebank/settings.py or tunebank/server_settings.py"
    assert set(env) - set(tunebank) <= {"CUPY_CACHE_DIR"}
    settings = ServerSettings(_env_file=None, **{SETTINGS[k]: v for k, v in tunebank.items()})  # validates values
    assert str(settings.data_dir) == DATA and mounts(compose()["services"][service])[DATA] == "tunebank-data"
    assert settings.database_url == "postgresql://tunebank:s3cret@postgres:5432/tunebank"
    assert settings.broker_url == "redis://redis:6379/0"


def test_compose_refuses_to_start_without_a_database_password():
    with pytest.raises(AssertionError, match="set POSTGRES_PASSWORD"):
        compose({})


def test_database_and_broker_urls_name_the_services_that_serve_them():
    services = compose()["services"]
    postgres = env_of(services["postgres"])
    url = env_of(services["api"])["TUNEBANK_DATABASE_URL"]
    assert url == (f"postgresql://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@postgres:5432/"
                   f"{postgres['POSTGRES_DB']}")
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]
    assert env_of(services["worker"])["TUNEBANK_BROKER_URL"].startswith("redis://redis:6379/")
    for name in TUNEBANK_SERVICES:
        depends = services[name]["depends_on"]
        if name == "migrate":
            assert depends["postgres"]["condition"] == "service_healthy"
        else:  # the schema exists before anything else opens the database
            assert depends["migrate"]["condition"] == "service_completed_successfully"
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_volumes_are_declared_and_shared():
    spec = compose()
    services = spec["services"]
    named = {source for service in services.values() for source in mounts(service).values()
             if not source.startswith((".", "/"))}
    assert named == set(spec["volumes"])  # every named volume declared, none declared and unused
    for name in TUNEBANK_SERVICES:  # uploads (api -> workers) and plans (workers -> api) travel through it
        assert mounts(services[name])[DATA] == "tunebank-data"
    assert mounts(services["postgres"])["/var/lib/postgresql/data"] == "postgres-data"
    assert mounts(services["redis"])["/data"] == "redis-data"
    crawler = services["crawler"]
    assert env_of(crawler)["TUNEBANK_CRAWL_DIRS"] in mounts(crawler)
    assert crawler["volumes"][-1].endswith(":ro")  # models are read, never written
    for name in ("worker", "crawler"):
        assert env_of(services[name])["CUPY_CACHE_DIR"].startswith(DATA + "/")  # compiled kernels persist
    for name in ("Dockerfile", "Dockerfile.worker"):
        assert instructions(name, "VOLUME") == [f'["{DATA}"]']
        assert any(f"TUNEBANK_DATA_DIR={DATA}" in env for env in instructions(name, "ENV"))
    assert any(f"CUPY_CACHE_DIR={DATA}/cupy-cache" in env for env in instructions("Dockerfile.worker", "ENV"))


def test_gpus_one_per_container_and_the_queue_the_api_publishes_to():
    services = compose()["services"]
    gpus = {}
    for name in ("worker", "crawler"):
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        gpus[name] = tuple(device["device_ids"])
    assert len(set(gpus.values())) == 2 and all(len(ids) == 1 for ids in gpus.values())  # timings never share a GPU
    queue = parse_cli(services["worker"]["command"])[1]["queue"]
    api = env_of(services["api"])
    assert api["TUNEBANK_EXECUTOR"] == "celery" and api["TUNEBANK_QUEUE"] == queue
    assert parse_cli(yaml.safe_load(instructions("Dockerfile.worker", "CMD")[0]))[1]["queue"] == queue


def test_the_api_port_agrees_everywhere():
    api = compose()["services"]["api"]
    port = parse_cli(api["command"])[1]["port"]
    assert [p.split(":")[-1] for p in api["ports"]] == [str(port)]
    assert instructions("Dockerfile", "EXPOSE") == [str(port)]
    (health,) = instructions("Dockerfile", "HEALTHCHECK")
    assert f"http://127.0.0.1:{port}/healthz" in health
    assert parse_cli(yaml.safe_load(instructions("Dockerfile", "CMD")[0]))[1]["port"] == port
    for name in ("postgres", "redis", "worker", "crawler", "migrate"):
        assert "ports" not in compose()["services"][name]  # only the API is published


def test_torch_is_pinned_as_in_constraints():
    (pin,) = re.findall(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    api = [run for run in instructions("Dockerfile", "RUN") if "torch==" in run]
    worker = [run for run in instructions("Dockerfile.worker", "RUN") if "torch==" in run]
    assert len(api) == len(worker) == 1
    assert f'"torch=={pin}"' in api[0] and "--index-url https://download.pytorch.org/whl/cpu " in api[0]
    assert f'"torch=={pin}"' in worker[0] and re.search(r"download\.pytorch\.org/whl/cu\d+", worker[0])
    for name in ("Dockerfile", "Dockerfile.worker"):
        runs = instructions(name, "RUN")
        torch_at = next(i for i, run in enumerate(runs) if "torch==" in run)
        project_at = next(i for i, run in enumerate(runs) if "-c constraints.txt" in run)
        assert torch_at < project_at  # torch first: no dependency range pulls another build


def test_worker_image_has_cuda_and_cupy():
    (base,) = instructions("Dockerfile.worker", "FROM")
    assert base.startswith("nvidia/cuda:") and "-runtime-" in base
    cuda_major = re.match(r"nvidia/cuda:(\d+)\.", base).group(1)
    index = next(run for run in instructions("Dockerfile.worker", "RUN") if "torch==" in run)
    assert re.search(rf"whl/cu{cuda_major}\d\b", index)  # torch's CUDA build matches the base image
    project = next(run for run in instructions("Dockerfile.worker", "RUN") if "-c constraints.txt" in run)
    assert ".[gpu,server]" in project  # CuPy + NVRTC, and Celery
    assert f"cupy-cuda{cuda_major}x" in (ROOT / "pyproject.toml").read_text()


def test_images_copy_what_exists_and_run_as_a_user():
    for name in ("Dockerfile", "Dockerfile.worker"):
        for copy in instructions(name, "COPY"):
            *sources, _ = shlex.split(copy)
            for source in sources:
                assert (ROOT / source).exists(), f"{name}: COPY {source}: no such file in the build context"
        assert instructions(name, "USER") == ["tunebank"]
        ignore = (DOCKER / f"{name}.dockerignore").read_text().splitlines()
        copied = {s.rstrip("/") for c in instructions(name, "COPY") for s in shlex.split(c)[:-1]}
        kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
        assert "**" in ignore and copied <= kept  # the context holds what is copied, nothing else
