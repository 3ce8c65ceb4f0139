"""Evidence sources beyond the item's own context, each a :class:`halluscope.core.retrieval.Retriever`.

Each module registers its retriever's name where the class is defined (importing this package imports them all):

==================  ============================================================================
spec                retriever
==================  ============================================================================
``kb:INDEX_DIR``    :class:`~halluscope.retrievers.kb.KBRetriever` — BM25 over a knowledge-base index
                    built by ``halluscope index build SOURCE --out INDEX_DIR``
``files:PATHS``     :class:`~halluscope.retrievers.files.FileRetriever` — TXT/Markdown/PDF/DOCX, a
                    folder or a comma-separated list of files
``kg:TRIPLES``      :class:`~halluscope.retrievers.kg.KGRetriever` — a TSV or N-Triples file,
                    triples linearised to sentences
``search:URL``      :class:`~halluscope.retrievers.search.SearchRetriever` — an HTTP JSON search API
                    (off unless configured; key from ``$HALLUSCOPE_SEARCH_KEY``)
==================  ============================================================================

The front of the ``retrievers`` kind (defined in :mod:`halluscope.core.retrieval`, where ``context`` is):
``get_retriever(name)`` (the factory), ``retriever_names()``, ``register_retriever(name, factory)``, and
``make_retriever("NAME:ARG")``, which *builds* a retriever: ``get_retriever(NAME)(ARG)``, optionally cached.
"""

from halluscope.core.retrieval import get_retriever, make_retriever, register_retriever, retriever_names
from halluscope.retrievers.files import FileRetriever
from halluscope.retrievers.kb import KBRetriever, build_index
from halluscope.retrievers.kg import KGRetriever
from halluscope.retrievers.search import SearchRetriever

__all__ = ["FileRetriever", "KBRetriever", "KGRetriever", "SearchRetriever", "build_index", "get_retriever",
           "make_retriever", "register_retriever", "retriever_names"]
