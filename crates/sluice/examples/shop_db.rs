//! Generates the quickstart's sample shop: customers, products, orders and order items in a
//! SQLite database, deterministically (the same file every time), with the value kinds a real
//! shop has: decimals, date-times, booleans, JSON, unicode text and NULLs.
//!
//! Usage: `cargo run --release -p sluice --example shop_db -- examples/data/shop.db`

use rusqlite::{params, Connection};

/// A small deterministic generator (xorshift64*), so the sample needs no dependency.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, limit: u64) -> u64 {
        self.next() % limit
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

const CUSTOMERS: u64 = 20_000;
const PRODUCTS: u64 = 2_000;
const ORDERS: u64 = 40_000;

fn date_time(random: &mut Random) -> String {
    format!(
        "20{:02}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
        20 + random.below(6),
        1 + random.below(12),
        1 + random.below(28),
        random.below(24),
        random.below(60),
        random.below(60),
        random.below(1_000_000)
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: shop_db OUTPUT.db")?;
    let _ = std::fs::remove_file(&path);
    if let Some(parent) = std::path::Path::new(&path).parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut connection = Connection::open(&path)?;
    connection.execute_batch(
        "CREATE TABLE customers (id INTEGER PRIMARY KEY, email VARCHAR(120) NOT NULL UNIQUE, name VARCHAR(80) NOT NULL,
             city VARCHAR(60), vip BOOLEAN NOT NULL, signed_up DATETIME NOT NULL);
         CREATE TABLE products (id INTEGER PRIMARY KEY, sku CHAR(10) NOT NULL, title TEXT NOT NULL,
             price DECIMAL(10,2) NOT NULL, attributes JSON, discontinued DATE);
         CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
             status VARCHAR(16) NOT NULL, placed_at DATETIME NOT NULL, note TEXT);
         CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id), line INTEGER NOT NULL,
             product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL,
             unit_price DECIMAL(10,2) NOT NULL, PRIMARY KEY (order_id, line));",
    )?;
    let mut random = Random(0x5EED_5EED_5EED_5EED);
    let first =
        ["Ana", "Björn", "Chen", "Dmitri", "Émilie", "Farah", "Grace", "Hiro", "Inés", "José", "Kwame", "Łucja"];
    let last = ["Silva", "Okafor", "Müller", "Nakamura", "O'Brien", "García", "Ivanova", "Smith", "Kowalski", "Nguyễn"];
    let cities = ["Lisboa", "Lagos", "Zürich", "東京", "Dublin", "Sevilla", "Kraków", "Accra", "São Paulo"];
    let transaction = connection.transaction()?;
    {
        let mut insert = transaction.prepare("INSERT INTO customers VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?;
        for id in 1..=CUSTOMERS {
            let name = format!("{} {}", random.pick(&first), random.pick(&last));
            let city = (random.below(10) > 0).then(|| random.pick(&cities));
            insert.execute(params![
                id,
                format!("customer{id}@example.com"),
                name,
                city,
                random.below(20) == 0,
                date_time(&mut random)
            ])?;
        }
        let mut insert = transaction.prepare("INSERT INTO products VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?;
        let kinds = ["Mug", "Lamp", "Chair", "Kettle", "Notebook", "Scarf", "Backpack", "Teapot 🍵"];
        let colours = ["red", "blue", "green", "black", "white"];
        for id in 1..=PRODUCTS {
            let kind = random.pick(&kinds);
            let price = format!("{}.{:02}", 1 + random.below(300), random.below(100));
            let attributes = (random.below(4) > 0).then(|| {
                format!(r#"{{"colour":"{}","weight_g":{}}}"#, random.pick(&colours), 50 + random.below(5_000))
            });
            let discontinued = (random.below(15) == 0)
                .then(|| format!("2025-{:02}-{:02}", 1 + random.below(12), 1 + random.below(28)));
            insert.execute(params![
                id,
                format!("SKU{id:07}"),
                format!("{kind} no. {id}"),
                price,
                attributes,
                discontinued
            ])?;
        }
        let mut insert_order = transaction.prepare("INSERT INTO orders VALUES (?1, ?2, ?3, ?4, ?5)")?;
        let mut insert_item = transaction.prepare("INSERT INTO order_items VALUES (?1, ?2, ?3, ?4, ?5)")?;
        let statuses = ["placed", "paid", "shipped", "delivered", "returned"];
        for id in 1..=ORDERS {
            let note = (random.below(8) == 0).then(|| "leave at the door, \"please\"".to_owned());
            insert_order.execute(params![
                id,
                1 + random.below(CUSTOMERS),
                random.pick(&statuses),
                date_time(&mut random),
                note
            ])?;
            for line in 1..=(1 + random.below(4)) {
                let price = format!("{}.{:02}", 1 + random.below(300), random.below(100));
                insert_item.execute(params![id, line, 1 + random.below(PRODUCTS), 1 + random.below(5), price])?;
            }
        }
    }
    transaction.commit()?;
    let total: i64 = connection.query_row(
        "SELECT (SELECT count(*) FROM customers) + (SELECT count(*) FROM products) + (SELECT count(*) FROM orders) + (SELECT count(*) FROM order_items)",
        [],
        |row| row.get(0),
    )?;
    println!("wrote {path}: {total} rows in 4 tables");
    Ok(())
}
