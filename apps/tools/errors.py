"""Error codes of the tools app (volumes admin)."""

from apps.core.errors import ApplicationError

VOLUME_NAME_INVALID = "volume_name_invalid"
VOLUME_MODE_INVALID = "volume_mode_invalid"
VOLUME_NOT_FOUND = "volume_not_found"
VOLUME_STATIC = "volume_static"
VOLUME_BINDING_INVALID = "volume_binding_invalid"
VOLUME_OP_INVALID = "volume_op_invalid"
VOLUMES_NOT_CONFIGURED = "volumes_not_configured"
VOLUMES_ROOT_MISSING = "volumes_root_missing"
VOLUME_DIR_FAILED = "volume_dir_failed"


class VolumesUnavailable(ApplicationError):
    """This host cannot make the volume's directory (root not mounted, disk error): 503."""

    status, code = 503, VOLUMES_ROOT_MISSING
