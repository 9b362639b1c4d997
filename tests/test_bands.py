"""The window band of a call (jfa.kernels.bands.window_band): which kernel path it takes and its offsets."""
import pytest

from jfa.kernels.bands import UNBOUNDED, window_band

U = UNBOUNDED
CASES = [
    ("full", False, (-1, -1), (False, False, -U, U)),
    ("causal", True, (-1, -1), (True, False, -U, 0)),
    ("diagonal-window-is-causal", False, (-1, 0), (True, False, -U, 0)),
    ("causal-with-its-own-window", True, (-1, 0), (True, False, -U, 0)),
    ("causal-left-window", True, (3, 0), (True, True, -3, 0)),
    ("left-window-right-diagonal-not-causal-flag", False, (3, 0), (False, True, -3, 0)),
    ("right-only", False, (-1, 5), (False, True, -U, 5)),
    ("left-only", False, (0, -1), (False, True, 0, U)),
    ("both-sides", False, (2, 2), (False, True, -2, 2)),
]


@pytest.mark.parametrize("causal, window, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_window_band_names_the_path_and_the_offsets(causal, window, expected):
    assert window_band(causal, window) == expected
