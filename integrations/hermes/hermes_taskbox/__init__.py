"""hermes-taskbox: taskbox as a Hermes Agent terminal backend.

``pip install ./integrations/hermes``, then ``plugins.enabled: [taskbox]`` and
``terminal.backend: taskbox`` in Hermes's config.yaml. See README.md.
"""

from __future__ import annotations

import logging

from .ids import taskbox_task_id
from .provider import TaskboxProvider

__all__ = ["TaskboxProvider", "register", "taskbox_task_id"]
__version__ = "0.1.0"

logger = logging.getLogger(__name__)


def register(ctx) -> None:
    """Hermes's plugin entry point: registers the ``taskbox`` terminal environment provider.

    A Hermes without terminal backend plugins (hermes-agent 0.19.0 on PyPI) has no
    ``register_terminal_environment_provider``; the plugin then says so instead of failing the
    whole plugin load.
    """
    register_provider = getattr(ctx, "register_terminal_environment_provider", None)
    if register_provider is None:
        logger.warning(
            "hermes-taskbox: this Hermes has no terminal backend plugins "
            "(PluginContext.register_terminal_environment_provider); upgrade hermes-agent to "
            "use terminal.backend: taskbox"
        )
        return
    register_provider(TaskboxProvider())
