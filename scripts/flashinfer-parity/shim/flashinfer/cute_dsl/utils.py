"""fp4norm needs no CuTe DSL and runs on every GPU from sm_80."""


def is_cute_dsl_available() -> bool:
    return True


def is_cute_dsl_arch_supported(major: int, minor: int = 0) -> bool:
    return True
