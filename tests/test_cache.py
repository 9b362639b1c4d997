"""The identity cache of offset-derived work (``jfa.kernels.cache``): one build per tensor as it is now;
an in-place write, another tensor or another key part builds again; it holds at most its capacity."""
import torch

from jfa.kernels.cache import IdentityCache


def counting_build(builds: list):
    def build():
        builds.append(1)
        return len(builds)
    return build


def test_the_same_unmodified_tensor_is_built_once():
    cache, builds = IdentityCache(), []
    cu = torch.tensor([0, 3, 8])
    assert [cache.get_or_build((cu,), ("k",), counting_build(builds)) for _ in range(3)] == [1, 1, 1]


def test_an_in_place_write_builds_again():
    cache, builds = IdentityCache(), []
    cu = torch.tensor([0, 3, 8])
    cache.get_or_build((cu,), (), counting_build(builds))
    cu[1] = 4
    assert cache.get_or_build((cu,), (), counting_build(builds)) == 2


def test_another_tensor_with_equal_values_or_another_key_builds_again():
    cache, builds = IdentityCache(), []
    cu = torch.tensor([0, 3, 8])
    cache.get_or_build((cu,), ("k", 8), counting_build(builds))
    assert cache.get_or_build((cu.clone(),), ("k", 8), counting_build(builds)) == 2
    assert cache.get_or_build((cu,), ("q", 8), counting_build(builds)) == 3


def test_it_holds_at_most_its_capacity_and_drops_the_oldest_build():
    cache, builds = IdentityCache(capacity=2), []
    tensors = [torch.tensor([0, i]) for i in range(3)]
    for t in tensors:
        cache.get_or_build((t,), (), counting_build(builds))
    assert cache.get_or_build((tensors[2],), (), counting_build(builds)) == 3  # kept
    assert cache.get_or_build((tensors[0],), (), counting_build(builds)) == 4  # dropped, built again


def test_a_non_tensor_is_built_every_time():
    cache, builds = IdentityCache(), []
    assert [cache.get_or_build((None,), (), counting_build(builds)) for _ in range(2)] == [1, 2]
