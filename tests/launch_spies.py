"""Shared by the simulator tests: what each launch of a TLX kernel through its execution target compiled."""
from jfa.kernels.tlx.common import target


def constexpr_per_launch(monkeypatch, kernel, name: str) -> list:
    """The value of ``kernel``'s compile-time argument ``name`` in each of its launches from now on (through
    ``target.launch``; a planned repeat of a launch does not pass there), in order."""
    values = []
    real_launch = target.launch

    def spy(launched, grid, device, *args, **kwargs):
        if launched is kernel:
            values.append(kwargs[name])
        return real_launch(launched, grid, device, *args, **kwargs)

    monkeypatch.setattr(target, "launch", spy)
    return values
