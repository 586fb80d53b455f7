"""CM ids: random version-4 UUIDs in the canonical text form."""

from __future__ import annotations

import uuid

from condmsg.sending.sender import new_cm_id


def test_cm_ids_are_canonical_random_uuids() -> None:
    ids = [new_cm_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # lower-case hex, dashes where uuid puts them
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
    # Every one of the 122 random bits varies across the ids (none stuck at 0 or 1).
    ints = [uuid.UUID(text).int for text in ids]
    fixed = (0xF << 76) | (0x3 << 62)  # the version nibble and the variant bits
    varying = 0
    for value in ints:
        varying |= value ^ ints[0]
    assert varying == ((1 << 128) - 1) & ~fixed
