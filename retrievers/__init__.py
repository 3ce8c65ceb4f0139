"""Evidence sources beyond the item's own context, each a :class:`halluscope.core.retrieval.Retriever`.

Importing this package registers their spec prefixes with :func:`halluscope.core.retrieval.register_retriever`:

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
"""

from halluscope.core.retrieval import register_retriever
from halluscope.retrievers.files import FileRetriever
from halluscope.retrievers.kb import KBRetriever, build_index
from halluscope.retrievers.kg import KGRetriever
from halluscope.retrievers.search import SearchRetriever

__all__ = ["FileRetriever", "KBRetriever", "KGRetriever", "SearchRetriever", "build_index"]

register_retriever("kb", KBRetriever)
register_retriever("files", FileRetriever)
register_retriever("kg", KGRetriever)
register_retriever("search", SearchRetriever)
