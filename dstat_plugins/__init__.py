"""The dstat/dool plugin files, shipped in the wheel as ``gpumon.faces.dstat.plugins``.

dstat and dool ``exec()`` the ``dstat_*.py`` / ``dool_*.py`` files themselves; this file
only makes the folder a package so that the installer finds them as package data.
"""
