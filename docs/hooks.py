"""MkDocs hook: the numpydoc docstrings use Sphinx cross-reference roles (:func:`fit`), which
mkdocstrings renders literally (":func:" before the code span); drop the role, keep the code."""

import re

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):(?=<code>)")


def on_page_content(html, **kwargs):
    return ROLE.sub("", html)
