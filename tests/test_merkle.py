"""Merkle trees and multiproofs (specs/merkle.md, proofs/merkle.py): RFC 6962's reference
trees, every position set proving, and nothing else proving."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs import merkle
from proofs.merkle import MerkleError

# RFC 6962's reference leaves and the roots of their first n, n = 0 .. 8: the values every
# implementation of RFC 6962 / 9162 (certificate-transparency's among them) is checked against.
RFC6962_LEAVES = [bytes.fromhex(x) for x in
                  ["", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f"]]
RFC6962_ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
# RFC 6962's inclusion proofs of leaves 0 and 5 in the tree of 8, leaf first (its audit path).
RFC6962_PATHS = {
    0: ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    5: ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
}


def test_the_roots_are_rfc_6962s():
    assert [merkle.root(RFC6962_LEAVES[:n]).hex() for n in range(9)] == RFC6962_ROOTS


def test_one_position_is_rfc_6962s_inclusion_proof_listed_left_to_right():
    """The same hashes as RFC 6962's audit path; in a left-to-right walk a sibling to the left
    (a higher one first) comes before one to the right (a lower one first)."""
    tree = merkle.Tree(RFC6962_LEAVES)
    assert [h.hex() for h in tree.prove([0])] == RFC6962_PATHS[0]
    path = RFC6962_PATHS[5]  # leaf 5's siblings: leaf 4 (left), [6, 8) (right), [0, 4) (left)
    assert [h.hex() for h in tree.prove([5])] == [path[2], path[0], path[1]]
    merkle.verify(tree.root, 8, [5], [RFC6962_LEAVES[5]], tree.prove([5]))


def mth(leaves: list[bytes]) -> bytes:
    """specs/merkle.md §1's recursion, word for word: the reference the packed levels are held to."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + mth(leaves[:k]) + mth(leaves[k:])).digest()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=4), max_size=300))
def test_the_levels_built_bottom_up_give_the_recursions_root_and_subtrees(leaves):
    """An odd last node carried up unchanged gives RFC 9162's split at the largest power of two,
    at every size (specs/merkle.md §1); and a position's proof is the recursion's siblings."""
    tree = merkle.Tree(leaves)
    assert tree.root == mth(leaves)
    if leaves:
        position = len(leaves) - 1  # the right edge, where the odd nodes are
        first = tree.prove([position])[0] if len(leaves) > 1 else None
        k = 1 << ((len(leaves) - 1).bit_length() - 1) if len(leaves) > 1 else 0
        assert first in (None, mth(leaves[:k]))  # the largest subtree left of it, listed first


@st.composite
def trees_and_positions(draw):
    leaves = draw(st.lists(st.binary(max_size=merkle.MAX_LEAF_BYTES), min_size=1, max_size=70))
    positions = sorted(draw(st.sets(st.integers(0, len(leaves) - 1), min_size=1)))
    return leaves, positions


@settings(max_examples=200, deadline=None)
@given(trees_and_positions())
def test_every_position_set_proves_with_the_length_the_spec_counts(case):
    leaves, positions = case
    tree = merkle.Tree(leaves)
    proof = tree.prove(positions)
    assert len(proof) == merkle.proof_length(len(leaves), positions)
    assert len(proof) <= len(positions) * max(1, (len(leaves) - 1).bit_length())
    merkle.verify(tree.root, len(leaves), positions, [leaves[i] for i in positions], proof)
    if len(positions) == len(leaves):
        assert proof == ()


def test_the_one_position_climb_is_the_walk_for_every_position_of_small_trees():
    """verify takes a leaf-up climb for one position (proofs/merkle.py ``_climb``) and the
    walk of specs/merkle.md §2 for more: both give the root, and both count a proof one hash
    short or long as bad_proof, at every position of every tree up to 40 leaves."""
    for size in range(1, 41):
        leaves = [b"leaf %d" % i for i in range(size)]
        tree = merkle.Tree(leaves)
        for i in range(size):
            proof = tree.prove([i])
            merkle.verify(tree.root, size, [i], [leaves[i]], proof)
            assert merkle.paths(tree.root, size, [i], [leaves[i]], proof) == (proof,)  # the walk
            for wrong in (proof[:-1], (*proof, proof[0] if proof else tree.root)):
                if len(wrong) == len(proof):
                    continue
                with pytest.raises(MerkleError) as caught:
                    merkle.verify(tree.root, size, [i], [leaves[i]], wrong)
                assert caught.value.reason == "bad_proof"
            if proof:
                swapped = proof[::-1]
                if swapped != proof:
                    with pytest.raises(MerkleError, match="mismatch"):
                        merkle.verify(tree.root, size, [i], [leaves[i]], swapped)


@settings(max_examples=200, deadline=None)
@given(trees_and_positions(), st.data())
def test_any_change_to_a_leaf_a_position_or_a_proof_hash_is_refused(case, data):
    leaves, positions = case
    tree = merkle.Tree(leaves)
    proof, given_leaves = list(tree.prove(positions)), [leaves[i] for i in positions]
    # Not the size: as RFC 9162's, a proof does not bind the tree's size (a proof of leaf 0 of 3
    # also gives the root as a proof of leaf 0 of 4); the size comes from the signed header.
    what = data.draw(st.sampled_from(["leaf", "proof", "position", "drop", "extra"]))
    size = len(leaves)
    if what == "leaf":
        j = data.draw(st.integers(0, len(given_leaves) - 1))
        changed = data.draw(st.binary(max_size=merkle.MAX_LEAF_BYTES).filter(lambda b: b != given_leaves[j]))
        given_leaves[j] = changed
    elif what == "proof" and proof:
        j = data.draw(st.integers(0, len(proof) - 1))
        proof[j] = bytes(b ^ 1 for b in proof[j][:1]) + proof[j][1:]
    elif what == "position" and len(positions) < size:
        free = sorted(set(range(size)) - set(positions))
        j = data.draw(st.integers(0, len(positions) - 1))
        moved = sorted({*positions[:j], *positions[j + 1:], data.draw(st.sampled_from(free))})
        if moved == positions or len(moved) != len(positions):
            return
        positions = moved
    elif what == "drop" and proof:
        proof.pop()
    elif what == "extra":
        proof.append(hashlib.sha256(b"extra").digest())
    else:
        return
    if what == "position" and [leaves[i] for i in positions] == given_leaves:
        return  # the moved position holds the same leaf: the same statement, still true
    with pytest.raises(MerkleError) as caught:
        merkle.verify(tree.root, size, positions, given_leaves, proof)
    assert caught.value.reason in ("mismatch", "bad_proof")


ANYTHING = st.one_of(st.none(), st.integers(-3, 2**33), st.binary(max_size=80), st.text(max_size=5),
                     st.lists(st.one_of(st.integers(-2, 40), st.binary(max_size=70)), max_size=6))


@settings(max_examples=400, deadline=None)
@given(ANYTHING, ANYTHING, ANYTHING, ANYTHING, ANYTHING)
def test_hostile_inputs_raise_only_merkle_error(root, size, positions, leaves, proof):
    with pytest.raises(MerkleError):
        merkle.verify(root, size, positions, leaves, proof)


def test_bad_input_is_refused_before_anything_is_hashed():
    tree = merkle.Tree([b"a", b"b", b"c"])
    for args in [(tree.root[:31], 3, [0], [b"a"], ()), (tree.root, 0, [0], [b"a"], ()),
                 (tree.root, 3, [1, 0], [b"b", b"a"], ()), (tree.root, 3, [0, 0], [b"a", b"a"], ()),
                 (tree.root, 3, [3], [b"a"], ()), (tree.root, 3, [], [], ()),
                 (tree.root, 3, [0], [b"x" * 65], ()), (tree.root, 3, [0], [], ()),
                 (tree.root, 3, [0], [b"a"], (b"short",) * tree.prove([0]).__len__())]:
        with pytest.raises(MerkleError) as caught:
            merkle.verify(*args)
        assert caught.value.reason == "bad_input", args
    with pytest.raises(MerkleError):
        merkle.Tree([b"x" * 65])


@settings(max_examples=150, deadline=None)
@given(trees_and_positions())
def test_each_positions_own_proof_comes_out_of_a_multiproof(case):
    """What a member puts in each claim (specs/committee.md §4) from the one multiproof of its
    seats: every position's one-position proof, as the tree itself would give it."""
    leaves, positions = case
    tree = merkle.Tree(leaves)
    paths = merkle.paths(tree.root, len(leaves), positions, [leaves[i] for i in positions], tree.prove(positions))
    assert list(paths) == [tree.prove([i]) for i in positions]
    with pytest.raises(MerkleError):
        merkle.paths(hashlib.sha256(b"another root").digest(), len(leaves), positions,
                     [leaves[i] for i in positions], tree.prove(positions))
