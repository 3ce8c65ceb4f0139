"""Hand-written long answers with their evidence: a small sanity set for the response label (not a benchmark).

Each case is a question, an evidence passage, a long *correct* answer (a full sentence the evidence supports) and
a long *wrong* one of about the same length and wording (one or two facts swapped for ones the evidence
contradicts or lacks). HalluClean QA's right answers are short spans, so a response head fitted on it can learn
"long = hallucinated" (BENCHMARKS.md "Correct long answers: the response head's length shortcut"); these cases
say whether a served head does. Written for this check, not taken from any data set.
"""

LONG_CASES = [
    {
        "question": "Where is the Eiffel Tower and when was it completed?",
        "context": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889.",
        "correct": "The Eiffel Tower is in Paris and was completed in 1889.",
        "wrong": "The Eiffel Tower is in Berlin and was completed in 1912.",
    },
    {
        "question": "Who wrote Pride and Prejudice, and when was it published?",
        "context": "Pride and Prejudice is a novel by Jane Austen. It was first published in 1813 by Thomas Egerton.",
        "correct": "Pride and Prejudice was written by Jane Austen and first published in 1813.",
        "wrong": "Pride and Prejudice was written by Charlotte Bronte and first published in 1847.",
    },
    {
        "question": "What is the capital of Australia?",
        "context": "Canberra is the capital city of Australia. It is located in the Australian Capital Territory.",
        "correct": "The capital of Australia is Canberra, which lies in the Australian Capital Territory.",
        "wrong": "The capital of Australia is Sydney, which lies in the state of New South Wales.",
    },
    {
        "question": "Which river flows through Vienna?",
        "context": "Vienna is the capital of Austria. The Danube flows through the city, which lies in the east of the country.",
        "correct": "The river that flows through Vienna is the Danube, in the east of Austria.",
        "wrong": "The river that flows through Vienna is the Rhine, in the west of Austria.",
    },
    {
        "question": "How tall is Mount Kilimanjaro and in which country is it?",
        "context": "Mount Kilimanjaro is a dormant volcano in Tanzania. Its summit, Uhuru Peak, is 5,895 metres above sea level.",
        "correct": "Mount Kilimanjaro is in Tanzania, and its summit rises 5,895 metres above sea level.",
        "wrong": "Mount Kilimanjaro is in Kenya, and its summit rises 6,962 metres above sea level.",
    },
    {
        "question": "Who painted the Mona Lisa?",
        "context": "The Mona Lisa is a portrait painting by the Italian artist Leonardo da Vinci. It hangs in the Louvre in Paris.",
        "correct": "The Mona Lisa was painted by the Italian artist Leonardo da Vinci and hangs in the Louvre.",
        "wrong": "The Mona Lisa was painted by the Dutch artist Rembrandt and hangs in the Prado.",
    },
    {
        "question": "When did Apollo 11 land on the Moon, and who was its commander?",
        "context": "Apollo 11 was the spaceflight that first landed humans on the Moon. Commander Neil Armstrong and pilot "
                   "Buzz Aldrin landed the lunar module Eagle on July 20, 1969.",
        "correct": "Apollo 11 landed on the Moon on July 20, 1969, with Neil Armstrong as its commander.",
        "wrong": "Apollo 11 landed on the Moon on March 14, 1972, with John Glenn as its commander.",
    },
    {
        "question": "What language is mainly spoken in Brazil?",
        "context": "Brazil is the largest country in South America. Its official and most widely spoken language is Portuguese.",
        "correct": "The language mainly spoken in Brazil is Portuguese, its official language.",
        "wrong": "The language mainly spoken in Brazil is Spanish, its official language.",
    },
]
