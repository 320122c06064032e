"""The channel app's error codes (each maps to one HTTP status through its base class). A
declaration's own (channel_not_found, channel_yaml_immutable, channel_name_in_use) are
apps.substrate.channeldefs', whose rows they are about."""

from __future__ import annotations

from apps.core.errors import ApplicationError, Conflict, Forbidden, Invalid, NotFound, PayloadTooLarge


class ChannelNotDeclared(NotFound):
    code = "channel_not_declared"


class UnknownChannel(NotFound):
    code = "unknown_channel"


class ChannelCursorRegression(Conflict):
    code = "channel_cursor_regression"


class ChannelValueTooLarge(PayloadTooLarge):
    code = "channel_value_too_large"


class NonSystemChannel(Forbidden):
    code = "non_system_channel"


class ChannelScopeInvalid(Invalid):
    code = "channel_scope_invalid"


class InvalidCursor(Invalid):
    code = "invalid_cursor"


class SystemScopeUnsupported(ApplicationError):
    status, code = 501, "channel_scope_unsupported"
