"""llmslo.app: not implemented yet; this subpackage has no public API in this release."""

__all__: list[str] = []
