"""Where headcut writes, and how (the guarantees of the README's "Safety" section).

* **Checked before work starts.** :func:`check_paths` refuses an output that is, contains or lies
  inside one of the run's inputs (the checkpoint, data, teacher, mask), an input that lies inside a
  folder the run would replace, and two outputs that overlap; paths are compared after resolving
  symbolic links. :meth:`OutputDir.check` and :meth:`OutputFile.check` refuse what cannot be written
  (a file where a folder goes, a missing parent folder, a folder that refuses a test write).
* **What ``--force`` replaces.** Only an empty folder or a folder headcut wrote (it holds a headcut
  report, or a ``config.json`` with a ``headcut`` record); any other non-empty folder is refused
  with a message naming what is in it, with or without ``--force``.
* **Atomic.** A folder is written into a temporary folder beside it, then renamed; a file into a
  temporary file, then renamed. Without ``--force`` the rename never replaces what another run put
  there in the meantime. Temporaries are named ``.NAME.headcut-tmp-PID-XXXX``; a run removes those
  a dead process left behind (SIGKILL cannot be caught).
* **One writer.** :class:`RunLock` (an exclusive lock file ``.NAME.headcut-lock`` beside the output)
  refuses a second run that writes the same output, and a second trainer on the same checkpoint
  folder, while the first one is alive. The operating system releases the lock of a killed process.
* **Special files are never replaced.** A rename only ever replaces a regular file (after resolving
  symbolic links). An output file that names a descriptor of the process (``/dev/stdout``,
  ``/dev/stderr``, ``/dev/fd/N`` as a shell's ``>(cmd)`` gives, ``/proc/self/fd/N``) is written
  through that descriptor; a character device (``/dev/null``, a terminal) or a named pipe, also
  through a symbolic link, is opened and written through (see :class:`OutputFile` for a pipe with no
  reader). Nothing is created beside such a file (no temporary, lock or probe file, no sweep), and
  ``--force`` is not needed. Sockets, block devices and other special files are refused, and so is
  an ``--out`` folder that is any of these.
* **Names the file system takes.** A path with a name longer than the file system allows (NAME_MAX,
  255 bytes on most) is refused up front; the temporary, old-copy and lock names of a long but legal
  name embed a shortened copy of it (its start and a hash), so they fit too.

The modules, one idea each: :mod:`.names` (names beside an output, name lengths), :mod:`.space` (one-line
errors of failed writes, full disks), :mod:`.special` (special output files), :mod:`.leftovers` (what a killed
run leaves), :mod:`.lock` (one writer), :mod:`.atomic` (folders and files written atomically) and :mod:`.plan`
(a command's outputs checked before its work).
"""
