"""The knowledge filesystem: a read-only, POSIX-like view of one space's published documents
(docs/filesystem.md).

``paths`` checks and builds virtual paths, ``tree`` resolves them to entries of the published
generation, ``listing`` serves ``ls``/``tree``/``find`` with signed keyset cursors, ``reading``
``cat``/``stat``/``diff``/``open_node``, ``grep`` the bounded text search, ``shell`` the safe
pipeline parser and ``tools`` the MCP tool table over all of them. Views, the command line and
the MCP transports call these and do nothing else.
"""
