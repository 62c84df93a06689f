"""The Python API's argument checks: :mod:`.table` (which argument of which public function is checked how, and
the :func:`~headcut.arguments.table.checked` decorator that applies it), :mod:`.fields` (the checks of the arguments
that are fields of a configuration, derived from the fields' declarations) and :mod:`.kinds` (the kinds of value no
declaration states: models, data, masks, output paths ...)."""
