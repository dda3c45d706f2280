"""Source texts of the ``grounded`` workload: short passages of prose and code snippets, each with
the words a request may ask to change. Written for the benchmark; plain data."""

from __future__ import annotations

PASSAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "The lighthouse stood on a rock at the mouth of the harbour. Every evening the keeper climbed "
        "the spiral stairs, trimmed the wick and wound the clockwork that turned the lens. Ships coming "
        "home from the north looked for its white flash before they looked for anything else. In winter "
        "the storms threw spray over the gallery, and the keeper wrote the height of the waves in a "
        "leather book that is still kept in the town library.",
        ("keeper", "harbour", "storms", "library"),
    ),
    (
        "A sourdough starter is a mixture of flour and water in which wild yeast and bacteria live "
        "together. The baker feeds it every day with fresh flour, and within a week it rises and smells "
        "slightly sour. A spoonful of the starter is mixed into the dough the evening before baking. The "
        "dough rests overnight in a cool kitchen, and by the morning it has doubled in size and is ready "
        "to be shaped into loaves.",
        ("starter", "baker", "dough", "kitchen"),
    ),
    (
        "The river changes its course slowly. On the outside of each bend the water runs fast and cuts "
        "into the bank, while on the inside it runs slowly and leaves sand behind. Over many years the "
        "bends grow wider until two of them meet, and the river takes the shorter path. The old bend is "
        "left behind as a quiet lake, shaped like a horseshoe, where herons wait in the reeds for fish.",
        ("river", "bank", "sand", "herons"),
    ),
    (
        "Our team meets every Monday at nine to plan the week. Each person says what they finished, what "
        "they are working on, and what is blocking them. The meeting lasts fifteen minutes, and anything "
        "that needs a longer discussion is moved to a separate call. Notes are written in the shared "
        "document, and the action items are assigned to a single owner with a due date, so that nothing "
        "is forgotten by the next meeting.",
        ("team", "meeting", "document", "owner"),
    ),
    (
        "The museum opened a new gallery of old maps this spring. The oldest map in the collection was "
        "drawn by hand on calfskin and shows the coast as sailors saw it five hundred years ago. Later "
        "maps were printed from copper plates and coloured with watercolour by hand. Visitors can use a "
        "magnifying glass to read the tiny names of ports, rivers and mountains, many of which have "
        "changed since the maps were made.",
        ("museum", "gallery", "sailors", "coast"),
    ),
    (
        "To replace a bicycle tyre, first open the brake and take the wheel out of the frame. Let the "
        "remaining air out of the tube, then push two tyre levers under the edge of the tyre and lift it "
        "over the rim. Pull out the old tube, check the inside of the tyre for glass or thorns, and put "
        "in the new tube with a little air in it. Finally press the tyre back onto the rim with your "
        "thumbs and pump it up to the pressure written on its side.",
        ("bicycle", "tyre", "wheel", "tube"),
    ),
)
"""(passage, words it contains that a request may replace)."""

REPLACEMENTS = ("captain", "garden", "window", "teacher", "market", "engine", "village", "blanket")
"""Words a replaced word becomes."""

CODE: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "def count_words(text):\n"
        "    counts = {}\n"
        "    for word in text.lower().split():\n"
        '        word = word.strip(".,;:!?")\n'
        "        if word:\n"
        "            counts[word] = counts.get(word, 0) + 1\n"
        "    return counts\n",
        ("text", "counts", "word"),
    ),
    (
        "def parse_config(path):\n"
        "    settings = {}\n"
        "    with open(path) as handle:\n"
        "        for line in handle:\n"
        "            line = line.strip()\n"
        '            if not line or line.startswith("#"):\n'
        "                continue\n"
        '            key, _, value = line.partition("=")\n'
        "            settings[key.strip()] = value.strip()\n"
        "    return settings\n",
        ("path", "settings", "handle", "value"),
    ),
    (
        "class Inventory:\n"
        "    def __init__(self):\n"
        "        self.items = {}\n"
        "\n"
        "    def add(self, name, count):\n"
        "        self.items[name] = self.items.get(name, 0) + count\n"
        "\n"
        "    def remove(self, name, count):\n"
        "        left = self.items.get(name, 0) - count\n"
        "        if left < 0:\n"
        '            raise ValueError("not enough " + name)\n'
        "        self.items[name] = left\n",
        ("items", "name", "count", "left"),
    ),
    (
        "function debounce(callback, delay) {\n"
        "  let timer = null;\n"
        "  return function (...args) {\n"
        "    clearTimeout(timer);\n"
        "    timer = setTimeout(() => {\n"
        "      callback.apply(this, args);\n"
        "    }, delay);\n"
        "  };\n"
        "}\n",
        ("callback", "delay", "timer", "args"),
    ),
    (
        "def merge_sorted(left, right):\n"
        "    merged = []\n"
        "    i = j = 0\n"
        "    while i < len(left) and j < len(right):\n"
        "        if left[i] <= right[j]:\n"
        "            merged.append(left[i])\n"
        "            i += 1\n"
        "        else:\n"
        "            merged.append(right[j])\n"
        "            j += 1\n"
        "    merged.extend(left[i:])\n"
        "    merged.extend(right[j:])\n"
        "    return merged\n",
        ("left", "right", "merged"),
    ),
)
"""(snippet, identifiers in it that a request may rename)."""

NEW_NAMES = ("data", "result", "buffer", "target", "source", "count_total", "entry", "holder")
"""Names a renamed identifier becomes."""

COMMENTS = (
    "checked by the nightly tests",
    "keep this in step with the documentation",
    "written for the report generator",
    "do not change without a benchmark",
)
"""Comments a request may ask to add as a snippet's first line (after ``#``, or ``//`` for a
snippet in braces)."""
