"""``reference.iosim``, the import path docs/design.md §4 and SPEC.md name for the IO model: the module itself lives
in ``reference.simulators.iosim`` (with the other simulators). Importing either path gives the same module object;
``python -m reference.iosim`` runs its command line."""
import sys

from reference.simulators import iosim as _iosim

if __name__ == "__main__":
    sys.exit(_iosim.main())
sys.modules[__name__] = _iosim
