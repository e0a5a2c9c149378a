"""The license of one indexed file, and where it was read, for citations and `--cite`'s verbatim check.

In order, the first that names one:

1. `spdx-header`: an `SPDX-License-Identifier:` line among the file's first `HEADER_LINES` lines
   (the expression as written, e.g. `MIT` or `Apache-2.0 OR MIT`, up to a comment closer);
2. `license-file`: the nearest LICENSE, LICENCE or COPYING file (any suffix: LICENSE.md,
   COPYING.txt, ...) in the file's folder or one above it, up to the root, recognised by
   `recognise_text` (a small matcher of the phrases that tell the common licenses apart: MIT, ISC,
   Apache-2.0, BSD-2/3/4-Clause, GPL, LGPL, AGPL, MPL-2.0, Unlicense); a license file that is
   not recognised names nothing, and the search goes on;
3. `package-metadata`: the license a package declares. In a repository, the nearest
   pyproject.toml's [project] `license` (a PEP 639 expression, `{text = ...}` or `{file = ...}`)
   or its `License ::` classifiers; under a site-packages directory (python-source's roots,
   hartonomous.corpus.sources: the root itself, or one holding the root), the installed
   distribution that owns the file's top-level package: its License-Expression, else its License
   field, else its classifiers, else its license files;
4. `unknown` (None).

GNU texts carry no "-only"/"-or-later" (only a header says which), so a GNU license recognised
from its text is named by its version alone (`GPL-3.0`, as GitHub's license detection does).
Reading a license file or package metadata is cached by path and modification time, so a
repository's thousands of files read its LICENSE once and a changed LICENSE is read again.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10: pyproject.toml is not read
    tomllib = None

HEADER_LINES = 20
SOURCES = ("spdx-header", "license-file", "package-metadata", "unknown")

_HEADER = re.compile(r"SPDX-License-Identifier:\s*([A-Za-z0-9(][A-Za-z0-9.+:() -]*)")
# LICENSE, COPYING.txt, LICENSE-MIT, COPYING.LESSER: not license.py or copying.c (source files)
_LICENSE_NAME = re.compile(r"^(licen[cs]e|copying)([-_][\w.-]+|\.(txt|md|rst|markdown|lesser|lib|gpl|mit|apache|bsd))?$",
                           re.IGNORECASE)


@dataclass(frozen=True)
class License:
    """An SPDX id or expression (None when unknown) and where it was read (one of `SOURCES`)."""

    spdx: str | None
    source: str


UNKNOWN = License(None, "unknown")


# --- recognising a license from its text or its name -----------------------------------------

def _normal(text: str) -> str:
    """Lower case, one space for any run of whitespace or comment marks: how phrases are compared."""
    return " ".join(re.sub(r"[#*>]|//", " ", text.lower()).split())


# (spdx, phrases that must all appear, phrases that must not), most specific first.
_TEXTS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # a GNU text names the other GNU licenses; its title line says which it is
    ("AGPL-3.0", ("gnu affero general public license version 3, 19 november 2007",), ()),
    ("LGPL-3.0", ("gnu lesser general public license version 3, 29 june 2007",), ()),
    ("LGPL-2.1", ("gnu lesser general public license version 2.1, february 1999",), ()),
    ("GPL-3.0", ("gnu general public license version 3, 29 june 2007",), ()),
    ("GPL-2.0", ("gnu general public license version 2, june 1991",), ()),
    ("MPL-2.0", ("mozilla public license", "2.0"), ()),
    ("Apache-2.0", ("apache license", "version 2.0"), ()),
    ("Unlicense", ("this is free and unencumbered software released into the public domain",), ()),
    ("ISC", ("permission to use, copy, modify, and", "with or without fee is hereby granted"), ()),
    ("MIT", ("permission is hereby granted, free of charge",
             "the above copyright notice and this permission notice shall be included"), ()),
    ("BSD-4-Clause", ("redistribution and use in source and binary forms", "all advertising materials"), ()),
    ("BSD-3-Clause", ("redistribution and use in source and binary forms", "to endorse or promote products"), ()),
    ("BSD-2-Clause", ("redistribution and use in source and binary forms",
                      "redistributions in binary form must reproduce"), ("to endorse or promote products",)),
)

# Names packages write in a License field or classifier, normalised (`_normal`), and their SPDX id.
_NAMES = {
    "mit": "MIT", "mit license": "MIT", "the mit license": "MIT", "mit-0": "MIT-0", "isc": "ISC",
    "isc license": "ISC", "isc license (iscl)": "ISC",
    "apache": "Apache-2.0", "apache 2": "Apache-2.0", "apache 2.0": "Apache-2.0", "apache-2": "Apache-2.0",
    "apache-2.0": "Apache-2.0", "apache license 2.0": "Apache-2.0", "apache license, version 2.0": "Apache-2.0",
    "apache software license": "Apache-2.0", "apache software license 2.0": "Apache-2.0", "asl 2": "Apache-2.0",
    "bsd-2-clause": "BSD-2-Clause", "bsd 2-clause": "BSD-2-Clause", "simplified bsd": "BSD-2-Clause",
    "bsd-3-clause": "BSD-3-Clause", "bsd 3-clause": "BSD-3-Clause", "new bsd": "BSD-3-Clause",
    "new bsd license": "BSD-3-Clause", "modified bsd": "BSD-3-Clause",
    "mpl-2.0": "MPL-2.0", "mpl 2.0": "MPL-2.0", "mozilla public license 2.0 (mpl 2.0)": "MPL-2.0",
    "gpl-3.0": "GPL-3.0", "gplv3": "GPL-3.0", "gnu general public license v3 (gplv3)": "GPL-3.0",
    "gnu general public license v3 or later (gplv3+)": "GPL-3.0-or-later",
    "gpl-2.0": "GPL-2.0", "gplv2": "GPL-2.0", "gnu general public license v2 (gplv2)": "GPL-2.0",
    "gnu general public license v2 or later (gplv2+)": "GPL-2.0-or-later",
    "lgpl-3.0": "LGPL-3.0", "lgplv3": "LGPL-3.0", "gnu lesser general public license v3 (lgplv3)": "LGPL-3.0",
    "gnu lesser general public license v3 or later (lgplv3+)": "LGPL-3.0-or-later",
    "lgpl-2.1": "LGPL-2.1", "lgplv2.1": "LGPL-2.1", "gnu lesser general public license v2 (lgplv2)": "LGPL-2.0",
    "gnu lesser general public license v2 or later (lgplv2+)": "LGPL-2.0-or-later",
    "python software foundation license": "PSF-2.0", "psf": "PSF-2.0", "psf-2.0": "PSF-2.0",
    "the unlicense (unlicense)": "Unlicense", "unlicense": "Unlicense",
}
_EXPRESSION = re.compile(r"^[A-Za-z0-9.+-]+( (AND|OR|WITH) [A-Za-z0-9.+-]+)*$")
_KNOWN_IDS = {v.lower(): v for v in _NAMES.values()}


def recognise_text(text: str) -> str | None:
    """The SPDX id of a license's full text (`_TEXTS`), or None when it is none of those."""
    normal = _normal(text)
    for spdx, must, must_not in _TEXTS:
        if all(p in normal for p in must) and not any(p in normal for p in must_not):
            return spdx
    return None


def recognise_name(name: str) -> str | None:
    """The SPDX id of a license name as packages write it ("MIT License", "Apache 2.0", an SPDX id or
    expression such as "MIT OR Apache-2.0"), or of a full text pasted in a License field; else None."""
    name = name.strip()
    if not name or name.upper() in ("UNKNOWN", "NONE"):
        return None
    if "\n" in name or len(name) > 200:
        return recognise_text(name)
    normal = _normal(name)
    if normal in _NAMES:
        return _NAMES[normal]
    if normal in _KNOWN_IDS:
        return _KNOWN_IDS[normal]
    operators = (" OR ", " AND ", " WITH ")
    if _EXPRESSION.match(name) and (any(ch.isdigit() for ch in name) or any(op in name for op in operators)):
        return name   # an SPDX id or expression as written ("BSD", "GPL", "Proprietary" name no version: None)
    return None


def _classifiers(classifiers: list[str]) -> str | None:
    """The SPDX id of the first `License ::` classifier that names one."""
    for c in classifiers:
        parts = [p.strip() for p in c.split("::")]
        if parts[0] == "License" and len(parts) > 1:
            spdx = recognise_name(parts[-1])
            if spdx:
                return spdx
    return None


# --- the three places a license is read ------------------------------------------------------

def header_license(text: str) -> str | None:
    """The expression of an `SPDX-License-Identifier:` line among the first HEADER_LINES lines."""
    for line in text.split("\n", HEADER_LINES)[:HEADER_LINES]:
        found = _HEADER.search(line)
        if found:
            value = re.sub(r"\s*-*\s*$", "", found.group(1))   # "MIT -->": the closer's dashes
            return value or None
    return None


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


@functools.lru_cache(maxsize=4096)
def _license_file_in(folder: Path, stamp: tuple) -> str | None:
    """The recognised license of folder's LICENSE/LICENCE/COPYING files (the first recognised, by name);
    `stamp` (the folder's listing times) keys the cache."""
    try:
        names = sorted(p.name for p in folder.iterdir() if _LICENSE_NAME.match(p.name) and p.is_file())
    except OSError:
        return None
    for name in names:
        try:
            spdx = recognise_text((folder / name).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if spdx:
            return spdx
    return None


def _folders_up(root: Path, rel_path: str) -> list[Path]:
    """The file's folder and each one above it, up to and including root."""
    folder = (root / rel_path).parent
    out = [folder]
    while folder != root and root in folder.parents:
        folder = folder.parent
        out.append(folder)
    return out


def _folder_stamp(folder: Path) -> tuple:
    """The modification stamps of folder and of its license files: a changed LICENSE changes it."""
    try:
        files = sorted(p for p in folder.iterdir() if _LICENSE_NAME.match(p.name))
    except OSError:
        return ()
    return (_stamp(folder), *((p.name, _stamp(p)) for p in files))


def license_file_license(root: Path, rel_path: str) -> str | None:
    """The license of the nearest recognised LICENSE/LICENCE/COPYING file from the file's folder up to root."""
    for folder in _folders_up(root, rel_path):
        spdx = _license_file_in(folder, _folder_stamp(folder))
        if spdx:
            return spdx
    return None


@functools.lru_cache(maxsize=1024)
def _pyproject_license(path: Path, stamp: tuple) -> str | None:
    if tomllib is None:
        return None
    try:
        project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    value = project.get("license")
    spdx = None
    if isinstance(value, str):
        spdx = recognise_name(value)
    elif isinstance(value, dict) and isinstance(value.get("text"), str):
        spdx = recognise_name(value["text"])
    elif isinstance(value, dict) and isinstance(value.get("file"), str):
        try:
            spdx = recognise_text((path.parent / value["file"]).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            spdx = None
    classifiers = project.get("classifiers")
    return spdx or (_classifiers(classifiers) if isinstance(classifiers, list) else None)


def _distribution_license(dist: importlib.metadata.Distribution) -> str | None:
    """An installed distribution's license: License-Expression, License, classifiers, license files."""
    meta = dist.metadata
    for value in (meta.get("License-Expression"), meta.get("License")):
        if value:
            spdx = recognise_name(str(value))
            if spdx:
                return spdx
    spdx = _classifiers(meta.get_all("Classifier") or [])
    if spdx:
        return spdx
    for entry in dist.files or []:
        name = entry.name
        if _LICENSE_NAME.match(name):
            try:
                spdx = recognise_text(dist.read_text(str(entry)) or "")
            except (OSError, UnicodeDecodeError):
                spdx = None
            if not spdx:
                try:
                    spdx = recognise_text(Path(dist.locate_file(entry)).read_text(encoding="utf-8", errors="replace"))
                except OSError:
                    spdx = None
            if spdx:
                return spdx
    return None


@functools.lru_cache(maxsize=1)
def _top_level_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.lru_cache(maxsize=1024)
def _installed_license(root: Path, top: str) -> str | None:
    """The license of the installed distribution whose top-level package `top` lies directly under root."""
    for name in _top_level_distributions().get(top, []):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        located = Path(dist.locate_file(top)).resolve()
        if located.parent != root:
            continue
        spdx = _distribution_license(dist)
        if spdx:
            return spdx
    return None


def package_license(root: Path, rel_path: str) -> str | None:
    """The license a package declares (module docstring, 3.): the nearest pyproject.toml, else the
    installed distribution owning the file's top-level package under root."""
    for folder in _folders_up(root, rel_path):
        pyproject = folder / "pyproject.toml"
        stamp = _stamp(pyproject)
        if stamp is not None:
            spdx = _pyproject_license(pyproject, stamp)
            if spdx:
                return spdx
    for site in [root, *_site_packages_above(root)]:   # root is site-packages, or a package inside one
        relative = (root / rel_path).relative_to(site).as_posix()
        top = relative.split("/", 1)[0]
        spdx = _installed_license(site, top.removesuffix(".py") if "/" not in relative else top)
        if spdx:
            return spdx
    return None


@functools.lru_cache(maxsize=64)
def _site_packages_above(root: Path) -> tuple[Path, ...]:
    """The interpreter's site-packages directories (python-source's roots) that hold root."""
    from hartonomous.corpus.sources import site_package_dirs

    return tuple(d for d in site_package_dirs() if d in root.parents)


def clear_caches() -> None:
    """Forget every license file, pyproject.toml and installed distribution read so far."""
    for cached in (_license_file_in, _pyproject_license, _top_level_distributions, _installed_license,
                   _site_packages_above):
        cached.cache_clear()


def detect_license(root: Path, rel_path: str, text: str) -> License:
    """The file's license and where it was read: its SPDX header, the nearest license file, the
    package's metadata, or unknown (module docstring)."""
    spdx = header_license(text)
    if spdx:
        return License(spdx, "spdx-header")
    root = Path(root).resolve()
    spdx = license_file_license(root, rel_path)
    if spdx:
        return License(spdx, "license-file")
    spdx = package_license(root, rel_path)
    if spdx:
        return License(spdx, "package-metadata")
    return UNKNOWN
