"""The options `pactl embed` and `pactl index` share to run on Ray (pactl.config.EngineConfig,
pactl.engines): --engine, --ray-address, --shards. Ray is imported only when asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from pactl.cli.options import choices
from pactl.config import EngineConfig, check_options, declaration, rules
from pactl.errors import UsageError

if TYPE_CHECKING:
    from enum import Enum

    Engine = Enum
else:
    Engine = choices("Engine", rules(EngineConfig)["engine"].names)


def _help(name: str) -> str:
    return str(declaration(EngineConfig, name)["help"])


EngineOption = Annotated[Engine, typer.Option(help=_help("engine"))]
RayAddress = Annotated[str | None, typer.Option(metavar="HOST:PORT", help=_help("ray_address"))]
Shards = Annotated[int, typer.Option(min=0, max=99_999, help=_help("shards"))]


def engine_config(engine: Any, ray_address: str | None, shards: int) -> EngineConfig:
    """The options as an EngineConfig, checked before any work: Ray installed and the cluster
    at --ray-address answering (pactl.engines.cluster.need_ray)."""
    from pactl.engines.cluster import need_ray

    config = check_options(EngineConfig(engine.value, ray_address, shards), UsageError)
    need_ray(config)
    return config
