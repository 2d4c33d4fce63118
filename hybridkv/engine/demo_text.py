"""The demo's inputs: a chat and a document with questions (plain data)."""

CHAT_TURNS = (
    "What is a cache in a computer?",
    "Why is it faster than main memory?",
    "What is the capital of France?",
)

DOCUMENT = """\
Port Aurel is a small harbour town on the northern coast of the Vessel Sea. It was founded
in 1642 by salt traders from the inland city of Marrow, who chose the site because a long
basalt reef shelters the bay from winter storms. For two centuries the town lived on salt
and dried fish, which were carried south on flat-bottomed barges along the river Lune.

In 1871 a railway reached Port Aurel and changed it completely. The line brought coal from
the Hollin hills, and the harbour was deepened so that steamships could load it. The
population grew from about 3,000 people to nearly 20,000 in thirty years. The old salt
warehouses along the quay were turned into the coal exchange, which still stands today and
now houses the town museum.

The town is known for three things. The first is the lighthouse on Grey Point, built in
1888, whose light can be seen 24 nautical miles away; it was the first lighthouse on the
coast to use an electric lamp. The second is the autumn Lantern Festival, held on the first
Saturday of October, when fishing families float paper lanterns out of the harbour to
remember sailors lost at sea. The third is a dark rye bread baked with sea salt and caraway,
called aurel bread, which is sold in every bakery on Market Street.

Today about 14,000 people live in Port Aurel. The coal trade ended in 1964, and the harbour
now serves fishing boats, a ferry to the island of Skarn three times a day, and in summer a
growing number of sailing yachts. The largest employer is the Aurel Marine Institute, a
research centre founded in 1979 that studies the cold-water coral reefs of the Vessel Sea.
The town council meets in the old customs house, and the current mayor, elected in 2022, is
Ilse Varga, a former ferry captain.
"""

QUESTIONS = (
    "When was Port Aurel founded, and by whom?",
    "What reached the town in 1871, and what did it bring?",
    "How far away can the Grey Point light be seen?",
    "When is the Lantern Festival held?",
    "What is aurel bread made with?",
    "Who is the mayor of Port Aurel?",
)


def document_prompt(question: str) -> str:
    """The user turn of one question about the shared document."""
    return (
        f"Read this document and answer the question briefly.\n\n{DOCUMENT}\nQuestion: {question}"
    )
