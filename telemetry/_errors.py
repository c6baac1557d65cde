"""The llmslo exception tree: every error llmslo raises on purpose derives from :class:`LlmsloError`."""

from __future__ import annotations


class LlmsloError(Exception):
    """Base of every error llmslo raises on purpose."""


class ConfigurationError(LlmsloError, ValueError):
    """A configuration value is invalid; the message names the field and the fix."""
