"""The license of an indexed file and where it was read (hartonomous.repository.license.detect_license).

In order: an SPDX-License-Identifier header in the file's first lines, else the nearest LICENSE /
COPYING file recognised to an SPDX id, else the package's declared license (pyproject.toml, or the
installed distribution owning the file under a site-packages root, as python-source reads them),
else unknown.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hartonomous.repository import license as lic
from hartonomous.repository.license import License, detect_license, header_license, recognise_name, recognise_text

MIT = """MIT License

Copyright (c) 2024 Example Authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.
"""

APACHE = """
                                 Apache License
                           Version 2.0, January 2004
                        http://www.apache.org/licenses/

   TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION
"""

BSD_CLAUSES = """Copyright (c) 2020, Example
All rights reserved.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice, this
   list of conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above copyright notice,
   this list of conditions and the following disclaimer in the documentation
   and/or other materials provided with the distribution.
"""
BSD_THIRD = """
3. Neither the name of the copyright holder nor the names of its
   contributors may be used to endorse or promote products derived from
   this software without specific prior written permission.
"""

GPL3 = """                    GNU GENERAL PUBLIC LICENSE
                       Version 3, 29 June 2007

 Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>
 ...
  13. Use with the GNU Affero General Public License.
 ...
library.  If this is what you want to do, use the GNU Lesser General
Public License instead of this License.
"""

LGPL3 = """                   GNU LESSER GENERAL PUBLIC LICENSE
                       Version 3, 29 June 2007

  This version of the GNU Lesser General Public License incorporates
the terms and conditions of version 3 of the GNU General Public
License, supplemented by the additional permissions listed below.
"""

MPL2 = """Mozilla Public License Version 2.0
==================================

1. Definitions
"""

ISC = """ISC License

Copyright (c) 2004-2010 by Internet Systems Consortium, Inc. ("ISC")

Permission to use, copy, modify, and/or distribute this software for any
purpose with or without fee is hereby granted, provided that the above
copyright notice and this permission notice appear in all copies.
"""


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("text, spdx", [
    (MIT, "MIT"), (APACHE, "Apache-2.0"), (BSD_CLAUSES + BSD_THIRD, "BSD-3-Clause"), (BSD_CLAUSES, "BSD-2-Clause"),
    (GPL3, "GPL-3.0"), (LGPL3, "LGPL-3.0"), (MPL2, "MPL-2.0"), (ISC, "ISC"),
    ("All rights reserved. Do not copy.", None), ("", None)])
def test_the_common_license_texts_are_told_apart(text: str, spdx: str | None) -> None:
    assert recognise_text(text) == spdx


@pytest.mark.parametrize("name, spdx", [
    ("MIT", "MIT"), ("MIT License", "MIT"), ("Apache 2.0", "Apache-2.0"), ("Apache Software License", "Apache-2.0"),
    ("BSD-3-Clause", "BSD-3-Clause"), ("MIT OR Apache-2.0", "MIT OR Apache-2.0"), ("GPL-3.0-or-later", "GPL-3.0-or-later"),
    ("BSD", None), ("BSD License", None), ("UNKNOWN", None), ("Proprietary", None), ("", None)])
def test_license_names_as_packages_write_them(name: str, spdx: str | None) -> None:
    assert recognise_name(name) == spdx


@pytest.mark.parametrize("text, spdx", [
    ("# SPDX-License-Identifier: MIT\nimport os\n", "MIT"),
    ("/* SPDX-License-Identifier: Apache-2.0 OR MIT */\nint x;\n", "Apache-2.0 OR MIT"),
    ("#!/usr/bin/env python\n# -*- coding: utf-8 -*-\n# SPDX-License-Identifier: GPL-2.0-only\n", "GPL-2.0-only"),
    ("<!-- SPDX-License-Identifier: CC-BY-4.0 -->\n# Doc\n", "CC-BY-4.0"),
    ("\n" * 30 + "# SPDX-License-Identifier: MIT\n", None),     # past the header lines: not a header
    ("import os\n", None)])
def test_an_spdx_header_is_read_from_the_first_lines(text: str, spdx: str | None) -> None:
    assert header_license(text) == spdx


def test_the_header_wins_over_the_license_file(tmp_path: Path) -> None:
    write(tmp_path, "LICENSE", MIT)
    text = "// SPDX-License-Identifier: BSD-3-Clause\nint main;\n"
    assert detect_license(tmp_path, "src/vendored.c", text) == License("BSD-3-Clause", "spdx-header")
    assert detect_license(tmp_path, "src/own.c", "int own;\n") == License("MIT", "license-file")


def test_the_nearest_recognised_license_file_names_the_license(tmp_path: Path) -> None:
    write(tmp_path, "LICENSE.md", APACHE)
    write(tmp_path, "third_party/lib/COPYING", GPL3)
    write(tmp_path, "docs/LICENSE", "Ask the authors before you copy anything here.\n")   # not recognised
    assert detect_license(tmp_path, "third_party/lib/deep/a.c", "x\n") == License("GPL-3.0", "license-file")
    assert detect_license(tmp_path, "docs/guide.md", "x\n") == License("Apache-2.0", "license-file")
    assert detect_license(tmp_path, "top.py", "x\n") == License("Apache-2.0", "license-file")


def test_a_changed_license_file_is_read_again(tmp_path: Path) -> None:
    write(tmp_path, "LICENSE", MIT)
    assert detect_license(tmp_path, "a.py", "a\n").spdx == "MIT"
    write(tmp_path, "LICENSE", ISC + "\n" * 3)   # another size, so its stamp changes even within a tick
    assert detect_license(tmp_path, "a.py", "a\n").spdx == "ISC"


@pytest.mark.parametrize("project, spdx", [
    ('license = "MPL-2.0"', "MPL-2.0"),
    ('license = {text = "MIT License"}', "MIT"),
    ('license = {file = "legal/terms.txt"}', "BSD-2-Clause"),
    ('classifiers = ["License :: OSI Approved :: Apache Software License"]', "Apache-2.0")])
def test_without_a_license_file_the_pyproject_metadata_names_it(tmp_path: Path, project: str, spdx: str) -> None:
    write(tmp_path, "pyproject.toml", f'[project]\nname = "demo"\n{project}\n')
    write(tmp_path, "legal/terms.txt", BSD_CLAUSES)   # not a LICENSE/COPYING name: read only through {file = ...}
    assert detect_license(tmp_path, "pkg/mod.py", "x\n") == License(spdx, "package-metadata")


def test_nothing_that_names_a_license_is_unknown(tmp_path: Path) -> None:
    write(tmp_path, "pyproject.toml", '[project]\nname = "demo"\n')
    assert detect_license(tmp_path, "a.py", "a = 1\n") == License(None, "unknown")


def install(site: Path, name: str, top: str, metadata: str, license_file: str | None = None) -> None:
    """A distribution installed in `site` as pip lays one out: its package and its dist-info."""
    write(site, f"{top}/__init__.py", "VALUE = 1\n")
    info = f"{name}-1.0.dist-info"
    write(site, f"{info}/METADATA", f"Metadata-Version: 2.4\nName: {name}\nVersion: 1.0\n{metadata}")
    record = [f"{top}/__init__.py,,", f"{info}/METADATA,,", f"{info}/RECORD,,"]
    if license_file:
        write(site, f"{info}/licenses/LICENSE", license_file)
        record.append(f"{info}/licenses/LICENSE,,")
    write(site, f"{info}/RECORD", "\n".join(record) + "\n")
    write(site, f"{info}/top_level.txt", top + "\n")


def test_under_a_site_packages_root_the_installed_distribution_names_it(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site-packages"
    install(site, "expressed", "expressed_pkg", "License-Expression: Apache-2.0 OR MIT\n")
    install(site, "classified", "classified_pkg", "Classifier: License :: OSI Approved :: MIT License\n")
    install(site, "bsdish", "bsdish_pkg", "License: BSD\nClassifier: License :: OSI Approved :: BSD License\n",
            license_file=BSD_CLAUSES + BSD_THIRD)
    install(site, "silent", "silent_pkg", "")
    monkeypatch.syspath_prepend(str(site))
    lic.clear_caches()
    try:
        assert detect_license(site, "expressed_pkg/__init__.py", "VALUE = 1\n") == License(
            "Apache-2.0 OR MIT", "package-metadata")
        assert detect_license(site, "classified_pkg/__init__.py", "x\n") == License("MIT", "package-metadata")
        assert detect_license(site, "bsdish_pkg/__init__.py", "x\n") == License("BSD-3-Clause", "package-metadata")
        assert detect_license(site, "silent_pkg/__init__.py", "x\n") == License(None, "unknown")
        # the same package copied elsewhere is not the installed distribution's file
        write(tmp_path / "elsewhere", "expressed_pkg/__init__.py", "VALUE = 1\n")
        assert detect_license(tmp_path / "elsewhere", "expressed_pkg/__init__.py", "x\n").source == "unknown"
    finally:
        monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(site)])
        lic.clear_caches()


def test_source_files_named_like_a_license_are_not_license_files(tmp_path: Path) -> None:
    write(tmp_path, "LICENSE", MIT)
    write(tmp_path, "pkg/license.py", '"""Recognises ' + GPL3 + '"""\n')   # quotes a license: still source
    write(tmp_path, "pkg/COPYING.LESSER", LGPL3)
    assert detect_license(tmp_path, "pkg/license.py", "x\n") == License("LGPL-3.0", "license-file")
    (tmp_path / "pkg/COPYING.LESSER").unlink()
    assert detect_license(tmp_path, "pkg/license.py", "x\n") == License("MIT", "license-file")
    # a docstring that mentions the header is no header
    assert header_license('"""Reads an `SPDX-License-Identifier:` line."""\n') is None


def test_a_package_inside_site_packages_indexed_alone_is_named_by_its_distribution() -> None:
    """python-source's own roots: an installed package's folder as the root (pytest's, MIT)."""
    import _pytest

    package = Path(_pytest.__file__).resolve().parent
    lic.clear_caches()
    assert detect_license(package, "python_api.py", "x\n") == License("MIT", "package-metadata")
