"""A plug-in module whose import fails, as a package with a missing dependency would."""
import attnspec_dependency_that_is_not_installed  # noqa: F401
