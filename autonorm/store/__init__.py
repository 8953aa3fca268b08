"""The tuning database, in modules of one job each.

:mod:`.db` is the API (:class:`~autonorm.store.db.TuningDB`), :mod:`.keys` what winners are keyed
by, :mod:`.schema` the tables and their migrations, :mod:`.connection` and :mod:`.recovery` how
files are opened and written safely, and :mod:`.snapshot` the standalone file that ships.
Winners travel between machines through :mod:`.bundle` (the sealed portable file),
:mod:`.transfer` (the merge of a file or another database) and :mod:`.audit` (integrity and
the state of every stored winner).
"""
