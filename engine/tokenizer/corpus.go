package tokenizer

// corpus is the text the synthetic vocabulary's merges are learned from: original plain
// English in ASCII, written for this package. It must not contain '<' or '>', so that no
// learned piece can spell a special token or a <0xXX> byte piece.
const corpus = `Once upon a time there was a little girl who lived in a small house near the woods.
She liked to play outside with her dog, and every morning they walked to the river together.
One day the sun was bright and the sky was blue. The girl saw a big red ball in the grass.
"Look!" she said to her mother. "Can I keep it?" Her mother smiled and said, "Yes, you can."
The dog ran after the ball, and the girl laughed. They played until it was time to eat.
After lunch, the girl sat under a tall tree and read a book about a brave little bird.
The bird wanted to fly over the mountains, but the wind was strong and the bird was tired.
It rested on a branch, ate some seeds, and then it tried again. This time it did not give up.
When the bird reached the top of the mountain, it could see the whole world below.
The girl closed the book and thought about the bird. She wanted to be brave, too.
In the evening her father came home from work. He was happy to see her and gave her a hug.
"What did you do today?" he asked. She told him about the ball, the dog and the bird.
They had dinner together: bread, soup, apples and milk. Then it was time to go to bed.
The girl looked out of the window at the moon and the stars. She felt warm and safe.
"Good night," said her mother. "Good night," said the girl, and she fell asleep.

The next day was rainy. The girl could not go outside, so she helped her mother in the kitchen.
They made a cake with flour, eggs, sugar and butter. It smelled so good that the dog came in.
"Not for you," the girl told the dog, and she gave him a small piece of bread instead.
When the rain stopped, there was a rainbow over the hills. It had many colors: red, orange,
yellow, green, blue and purple. The girl and her friend Tom ran outside to look at it.
Tom said, "I think there is gold at the end of the rainbow." The girl said, "Let's find it!"
They walked and walked, but the rainbow kept moving away. At last they sat down on a rock.
"Maybe the gold is not at the end," said the girl. "Maybe the gold is the walk we had."
Tom nodded. They went home, tired and happy, and ate the cake with her mother and father.

Numbers matter too: 1, 2, 3, 10, 20, 100, 2024 and 3.14 are written the way people write them.
A list can have items; a question can end with a mark? Some words have it's, don't, I'm,
we're, they've, you'll and she'd in them. Tabs	and  double  spaces appear, and so do lines
that end without a period
and lines that are short.

She learned that being kind is better than being right, and that a friend makes any day
better. Every time she saw a bird in the sky after that, she remembered the little bird
in the book, and she smiled. The end.
`
