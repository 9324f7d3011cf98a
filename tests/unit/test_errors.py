"""Every mnemos error derives from MnemosError and documents when it is raised."""

import inspect

import mnemos.errors as errors


def _error_classes():
    return [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, Exception) and obj.__module__ == errors.__name__
    ]


def test_rooted_hierarchy_and_documented():
    classes = _error_classes()
    assert len(classes) >= 8
    for cls in classes:
        assert issubclass(cls, errors.MnemosError), cls
        assert cls.__doc__ and "raised" in cls.__doc__.lower() or cls is errors.MnemosError, cls


def test_errors_carry_context():
    err = errors.DimensionMismatchError("query", (384,), (12,))
    assert err.expected == (384,) and err.actual == (12,)
    assert isinstance(err, ValueError)
    unknown = errors.UnknownEntryError("t1", 7)
    assert isinstance(unknown, KeyError) and "t1" in str(unknown) and "7" in str(unknown)
    assert errors.EmptyQueryError("  ").query == "  "
